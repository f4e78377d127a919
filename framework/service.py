"""BrokerService: the broker, its plugins and one listening service per endpoint."""

from __future__ import annotations

import signal
import threading
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure

from .broker import Broker
from .config import BrokerConfig, Listener, build_config
from .errors import ConfigError
from .nodes import default_node_name
from .reasons import CloseReason
from .tcpserver import use_lean_server

log = Logger(namespace="msgbroker")


def describe_address(address: Any) -> str:
    """``tcp:127.0.0.1:4444``, ``unix:/path`` ... for the log."""
    kind = getattr(address, "type", None)
    if kind in ("TCP", "UDP"):
        host = address.host
        return (
            f"{kind.lower()}:[{host}]:{address.port}"
            if ":" in host
            else (f"{kind.lower()}:{host}:{address.port}")
        )
    name = getattr(address, "name", None)
    if name is not None:
        return f"unix:{name.decode() if isinstance(name, bytes) else name}"
    return str(address)


def _is_loopback_address(address: Any) -> bool:
    host = getattr(address, "host", None)
    if host is None:
        return True  # unix sockets are local
    import ipaddress

    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


class ListenerService(service.Service):
    """Listens on one endpoint with one protocol factory; fails startService if it cannot
    bind (so ``twistd`` exits with the reason instead of running without the listener)."""

    def __init__(
        self,
        broker: Broker,
        listener: Listener,
        endpoint: Any,
        factory: Any,
    ) -> None:
        self.broker = broker
        self.listener = listener
        self.endpoint = endpoint
        self.factory = factory
        self.port: Any = None
        #: where it is bound, as the log says it (once listening)
        self.address = ""
        self.setName(str(listener))

    def startService(self) -> None:
        super().startService()
        outcome: list[Any] = []
        self.endpoint.listen(self.factory).addBoth(outcome.append)
        if not outcome:
            raise ConfigError(f"{self.listener}: the endpoint did not bind synchronously")
        result = outcome[0]
        if isinstance(result, Failure):
            self.running = False
            raise ConfigError(f"cannot listen on {self.listener}: {result.getErrorMessage()}")
        self.port = result
        use_lean_server(result)  # about 230 bytes less per TCP connection
        address = describe_address(result.getHost())
        if self.listener.is_tls:
            address = "tls:" + address.removeprefix("tcp:")
        self.address = address
        self.broker.listening.append((self.listener, address))
        log.info(
            "{protocol} listening on {address}", protocol=self.listener.protocol, address=address
        )
        if "open" in self.broker.config.auth and not _is_loopback_address(result.getHost()):
            log.warn(
                "open login is enabled on {address}, which is not a loopback address: "
                "anyone who can reach it can log in as anyone",
                address=address,
            )

    def stopService(self) -> defer.Deferred[None] | None:
        super().stopService()
        if self.port is None:
            return None
        port, self.port = self.port, None
        stopped: defer.Deferred[None] = defer.maybeDeferred(port.stopListening)
        protocol, address = self.listener.protocol, self.address

        def said(result: Any) -> Any:
            log.info(
                "{protocol} stopped listening on {address}", protocol=protocol, address=address
            )
            return result

        return stopped.addCallback(said)


class BrokerService(service.MultiService):
    """The whole broker as a Twisted service: start binds every listener, stop closes every
    connection (sending the UNSUBSCRIBE presence events) and releases the ports."""

    def __init__(
        self, config: BrokerConfig, reactor: Any = None, broker_class: type[Broker] = Broker
    ) -> None:
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self.reactor = reactor
        self.broker = broker_class(config, reactor)
        for listener in self.broker.listeners():
            self._add_listener(listener)

    def _add_listener(self, listener: Listener) -> None:
        spec = self.broker.protocols.get(listener.protocol)
        if spec is None:
            known = ", ".join(sorted(self.broker.protocols)) or "none"
            raise ConfigError(
                f"unknown protocol {listener.protocol!r} in --listen (known: {known})"
            )
        factory: Any = spec.factory(self.broker, listener)
        endpoint_text = listener.endpoint
        if spec.build_endpoint is not None:
            try:
                endpoint = spec.build_endpoint(self.reactor, endpoint_text)
            except ValueError as e:
                raise ConfigError(f"bad endpoint in --listen {listener}: {e}") from None
            ListenerService(self.broker, listener, endpoint, factory).setServiceParent(self)
            return
        if endpoint_text.startswith("tls:"):
            # our TLS: any stream endpoint (tcp by default) wrapped with the broker's context
            rest = endpoint_text[len("tls:") :]
            endpoint_text = (
                rest if rest.split(":", 1)[0] in ("tcp", "tcp6", "unix") else "tcp:" + rest
            )
            # the clock matters: TLS flushes its writes with it (the global reactor otherwise)
            tls: Any = self.broker.server_tls()  # an IOpenSSLServerConnectionCreator
            factory = _TLSFactory(tls, False, factory, clock=self.reactor)
            factory.noisy = False  # the listener service logs what it is bound to
        endpoint_text = with_backlog(endpoint_text, self.broker.config.listen_backlog)
        try:
            endpoint = serverFromString(self.reactor, endpoint_text)
        except Exception as e:
            raise ConfigError(f"bad endpoint in --listen {listener}: {e}") from None
        ListenerService(self.broker, listener, endpoint, factory).setServiceParent(self)

    #: set by ``twistd msgbroker``: a listener that cannot bind ends the process with one
    #: line on stderr instead of a traceback
    exit_on_error = False

    #: what SIGHUP reads again: the TOML file given with ``--config`` (None: none), and the
    #: options of the command line, which override it (set by ``twistd msgbroker``). A
    #: service built otherwise (None) reloads its running configuration: the files it
    #: names (users, TLS, secret) are read again
    config_file: str | None = None
    overrides: dict[str, Any] | None = None
    #: set by ``twistd msgbroker``: once started, the heap so far is frozen out of the
    #: cyclic collector's full passes (:func:`msgbroker.memory.freeze_startup_heap`); a
    #: service in a test process leaves the process's collector alone
    freeze_heap = False

    #: signal number -> the handler it had before this service took it
    _previous_handlers: dict[int, Any]

    def startService(self) -> None:
        try:
            super().startService()
            self._name_node()
            # plugins start here too (the journal opens its directory): their
            # configuration errors end twistd with one line as well
            self.broker.started()
            self._handle_signals()
            log.info(
                "msgbroker {version} started as node {node}",
                version=_version(),
                node=self.broker.node_name,
            )
            if self.freeze_heap:
                from .memory import freeze_startup_heap

                frozen = freeze_startup_heap()
                log.debug("{frozen} objects of the started broker frozen", frozen=frozen)
        except ConfigError as e:
            if not self.exit_on_error:
                raise
            import sys

            # the real stderr: twistd has redirected sys.stderr into its log by now
            (sys.__stderr__ or sys.stderr).write(f"twistd msgbroker: error: {e}\n")
            raise SystemExit(2) from None

    def _name_node(self) -> None:
        """A default node name whose first listener asked for port 0 takes the port the
        system chose (so brokers on ephemeral ports on one host are named apart)."""
        broker = self.broker
        listeners = broker.listeners()
        if broker.config.node_name is None and listeners and broker.listening:
            listener, address = broker.listening[0]
            if listener == listeners[0]:
                broker.node_name = default_node_name(listeners, bound=address)

    # -- signals: SIGTERM and SIGINT stop (Twisted's own handlers), these do not -----------

    def _handle_signals(self) -> None:
        """SIGHUP, which a shell or service manager sends routinely, must not end the broker
        (Python's default for it is to terminate); SIGUSR1 logs a status line. Only in the
        main thread of a real process: a broker run inside tests leaves signals alone."""
        self._previous_handlers = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in (
            (signal.SIGHUP, self.hangup),
            (signal.SIGUSR1, self.log_status),
        ):
            self._previous_handlers[signum] = signal.signal(
                signum, self._from_signal(signum, handler)
            )

    def _from_signal(self, signum: int, handler: Any) -> Any:
        def on_signal(number: int, frame: Any) -> None:
            self.reactor.callFromThread(handler)
            # twistd rotates its log file on SIGUSR1: keep whatever was there before
            previous = self._previous_handlers.get(signum)
            if callable(previous):
                previous(number, frame)

        return on_signal

    def _restore_signals(self) -> None:
        for signum, previous in getattr(self, "_previous_handlers", {}).items():
            signal.signal(signum, previous)
        self._previous_handlers = {}

    def hangup(self) -> None:
        """SIGHUP: read the configuration again (the ``--config`` file, then the command
        line's options over it) and reload the broker with it (:meth:`Broker.reload`: the
        users file, the TLS certificate and key, the log level, ...). A configuration that
        cannot be used is refused in one log line, and the broker goes on as it was."""
        broker = self.broker
        refusal = None
        try:
            config = broker.config
            if self.overrides is not None:
                config = build_config(
                    self.config_file, self.overrides, lambda *_: broker.plugins.config_sections()
                )
            broker.reload(config)
        except ConfigError as e:
            refusal = str(e)
        except Exception as e:  # a broken plugin must not end the broker either
            refusal = repr(e)
        if refusal is not None:
            log.error("SIGHUP: reload refused, the running settings stay: {error}", error=refusal)
            return
        log.info(
            "SIGHUP: reloaded the configuration{source}",
            source=f" from {self.config_file}" if self.config_file else "",
        )

    def log_status(self) -> None:
        """SIGUSR1: one status line."""
        log.info("status: {status}", status=self.broker.status())

    @defer.inlineCallbacks
    def stopService(self) -> Any:
        """Stop accepting, then drain: every session leaves the routing core (newest first,
        so each one's UNSUBSCRIBE presence events reach the sessions still open) and reads
        nothing more; each connection is closed gracefully once its output is flushed;
        those still open after ``--shutdown-grace`` seconds are aborted."""
        self._restore_signals()
        self.broker.stopping()
        yield super().stopService()
        broker = self.broker
        sessions = [s for s in reversed(broker.sessions) if s.close_reason is None]
        closing = [s for s in broker.sessions if s.close_reason is not None]
        grace = broker.config.shutdown_grace
        if sessions:
            log.info(
                "stopping: {count} connections get {grace:g} s to flush what they hold",
                count=len(sessions),
                grace=grace,
            )
        open_sessions = dict.fromkeys((*sessions, *closing))
        waits = [_connection_lost(s, open_sessions) for s in open_sessions]
        for session in sessions:  # all presence events first, while every peer is open
            broker.retire(session)
        broker.batcher.flush()
        for session in sessions:
            session.output.when_drained(_closer(self.reactor, session))
        if waits:
            timeout = self.reactor.callLater(grace, _abort_all, open_sessions, grace)
            yield defer.DeferredList(waits)
            if timeout.active():
                timeout.cancel()
        yield broker.stop_cluster()
        broker.stopped()


def _closer(reactor: Any, session: Any) -> Any:
    """Close ``session``'s connection gracefully, on the next turn: its output calls this
    from inside its transport's write (a producer resumed), where closing is not for it."""

    def drained() -> None:
        reactor.callLater(0, session.link.close_transport, CloseReason.SHUTDOWN)

    return drained


def with_backlog(endpoint: str, backlog: int) -> str:
    """``endpoint`` with ``backlog=`` added for the endpoint types that take one (tcp,
    tcp6, unix) unless it names its own: Twisted's default of 50 pending connections
    makes a burst of connects wait for SYN retransmits (seconds)."""
    kind = endpoint.split(":", 1)[0]
    if kind in ("tcp", "tcp6", "unix") and "backlog=" not in endpoint:
        return f"{endpoint}:backlog={backlog}"
    return endpoint


def _connection_lost(session: Any, open_sessions: dict[Any, None]) -> defer.Deferred[None]:
    d: defer.Deferred[None] = defer.Deferred()

    def lost() -> None:
        open_sessions.pop(session, None)
        d.callback(None)

    session.on_lost.append(lost)
    return d


def _abort_all(open_sessions: dict[Any, None], grace: float) -> None:
    """The grace time is over: cut what is still open."""
    log.info(
        "{count} connections still open after {grace:g} s: cut",
        count=len(open_sessions),
        grace=grace,
    )
    for session in list(open_sessions):
        session.link.abort()


class _TLSFactory(TLSMemoryBIOFactory):
    """TLS around a protocol factory that may refuse a connection (returns None: over a
    connection limit), which Twisted's wrapper does not expect."""

    def buildProtocol(self, addr: Any) -> Any:
        wrapped = self.wrappedFactory.buildProtocol(addr)
        if wrapped is None:
            return None
        return self.protocol(self, wrapped)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("msgbroker")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"
