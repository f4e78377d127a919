"""The Twisted half of every client: :class:`SessionDriver` runs a sans-IO
:class:`~msgbroker.clientkit.session.ClientSession` on a Twisted transport, and the rest is
how connections are made: :class:`ClientFactory`, :func:`client_endpoint` (TCP, or TLS
through :class:`~msgbroker.clientkit.tls.TLSClientEndpoint`), :func:`connect_client`, and
(from :mod:`.reconnecting`) :class:`~.reconnecting.ReconnectingClient`.

Nothing here imports the global reactor: a driver's ``clock`` and the ``reactor`` given to
the helpers are used; only a driver built without a clock falls back to the global reactor,
when it connects.

A protocol's Twisted client is a subclass of a transport's driver —
:class:`StreamClientProtocol` (TCP, TLS, unix streams),
:class:`~msgbroker.clientkit.twisted_ws.WebSocketClientDriver` (autobahn), or its own glue
for another transport — with the protocol's API: each request method asks the session for
a token and returns :meth:`SessionDriver._request`'s Deferred; :meth:`SessionDriver._dispatch`
gets the session's other events (deliveries) and hands them to the application through
:meth:`SessionDriver._deliver`, which logs a failing handler instead of closing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from .reconnect import Replay
from .reconnecting import ReconnectingClient
from .session import Answered, ClientSession, ConnectionClosed, Ended, Failed
from .tls import TLSClientEndpoint, client_tls_options

__all__ = [
    "ClientFactory",
    "ReconnectingClient",
    "SessionDriver",
    "StreamClientProtocol",
    "client_endpoint",
    "connect_client",
]


class SessionDriver:
    """Runs :attr:`session` on a Twisted transport; a mixin that a transport's glue
    completes. The glue calls :meth:`_transport_opened`, :meth:`_transport_data` (one unit:
    bytes, a packet, a WebSocket message) and :meth:`_transport_lost`, and provides
    :meth:`_write` and :meth:`_drop`.

    The driver writes what the session writes, runs its timers on ``clock`` (default: the
    global reactor, looked up when first needed), fires each request's Deferred with its
    answer, and when the session ends — or the connection is lost — fails what is pending,
    :meth:`when_ready` if it has not fired, and fires :meth:`when_closed`.
    """

    #: where the client logs (a protocol names its own namespace)
    log: ClassVar[Logger] = Logger(namespace="msgbroker.clientkit")
    #: how the log names this client, e.g. "SSMP client"
    client_name: ClassVar[str] = "client"
    #: whether the protocol opens with an exchange (a version check, a handshake) that
    #: ends with :meth:`_ready`; without one the client is ready once the transport opens
    opening_exchange: ClassVar[bool] = False

    def __init__(self, session: ClientSession, clock: Any = None) -> None:
        super().__init__()
        self.session = session
        self.clock = clock
        self._pending: dict[int, defer.Deferred[Any]] = {}
        self._ready_waiters: list[defer.Deferred[Any]] = []
        self._close_waiters: list[defer.Deferred[BaseException]] = []
        self._ready_value: Any = None
        self._is_ready = False
        self._timer: Any = None
        self._opened = False
        self._lost = False

    # -- for the application -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the connection is gone."""
        return self._lost

    def when_ready(self) -> defer.Deferred[Any]:
        """Fires once the protocol's opening exchange is done (with what it gave, e.g. the
        version chosen); fails with why the connection ended first."""
        if self._is_ready:
            return defer.succeed(self._ready_value)
        if self.session.error is not None:
            return defer.fail(self.session.error)
        d: defer.Deferred[Any] = defer.Deferred()
        self._ready_waiters.append(d)
        return d

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires with the reason (an exception) when the connection is gone."""
        if self._lost:
            return defer.succeed(self.session.error or self.session.closed())
        d: defer.Deferred[BaseException] = defer.Deferred()
        self._close_waiters.append(d)
        return d

    def close(self) -> defer.Deferred[None]:
        """Close the connection; fires once it is gone. What is pending fails with the
        protocol's "closed by the client" error."""
        if self._lost:
            return defer.succeed(None)
        closed = self.when_closed()
        self.session.close()
        self._fail_pending(self.session.pending_error())
        self._cancel_timer()
        self._drop(abort=False)
        return closed.addCallback(lambda _: None)

    # -- for protocol subclasses ---------------------------------------------------------------

    def _clock(self) -> Any:
        """The clock timers run on (the global reactor, looked up now, if none was given)."""
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        return self.clock

    def _now(self) -> float:
        return float(self._clock().seconds())

    def _request(self, ask: Callable[[], int]) -> defer.Deferred[Any]:
        """``ask()`` makes the session write a request and returns its token; a Deferred of
        the answer. A session already over fails it (:meth:`ClientSession.pending_error`);
        anything else ``ask`` raises (a bad argument) is raised at once."""
        if self._lost or self.session.ended:
            return defer.fail(self.session.pending_error())
        try:
            token = ask()
        except ConnectionClosed as e:
            return defer.fail(e)
        d: defer.Deferred[Any] = defer.Deferred()
        self._pending[token] = d
        self._run(self.session.events())
        return d

    def _replay(self, items: Sequence[Replay]) -> defer.Deferred[None]:
        """Ask each of ``items`` (what a lost session had set up) of the session, at once;
        fires once every answer came, fails with the first failure."""
        if self._lost or self.session.ended:
            return defer.fail(self.session.pending_error())
        waits: list[defer.Deferred[Any]] = []
        try:
            for item in items:
                token = item.ask(self.session, self._now())
                if token is not None:
                    d: defer.Deferred[Any] = defer.Deferred()
                    self._pending[token] = d
                    waits.append(d)
        except Exception as e:
            return defer.fail(e)
        self._run(self.session.events())
        gathered = defer.gatherResults(waits, consumeErrors=True)
        return gathered.addCallbacks(lambda _: None, _first_failure)

    def _write_now(self, write: Callable[[], object]) -> None:
        """``write()`` makes the session write something that gets no answer; send it."""
        if self._lost:
            raise self.session.closed()
        write()
        self._run(self.session.events())

    def _dispatch(self, event: Any) -> None:
        """An event of the protocol's own (a delivery, a notice): hand it on."""

    def _use_handlers(self, **handlers: Callable[[Any], Any] | None) -> None:
        """Event handlers given to the constructor (``on_message=...``) replace the methods
        of those names, which a subclass may override instead."""
        for name, handler in handlers.items():
            if handler is not None:
                setattr(self, name, handler)

    def _deliver(self, handler: Callable[[Any], Any], event: Any) -> Any:
        """``handler(event)``; a failing handler is logged, not fatal. Its result."""
        try:
            return handler(event)
        except Exception:
            self.log.failure("{client} event handler failed on {event!r}",
                             client=self.client_name, event=event)  # fmt: skip
            return None

    def _ready(self, value: Any = None) -> None:
        """The opening exchange is done: :meth:`when_ready` fires with ``value``."""
        self._is_ready, self._ready_value = True, value
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(value)

    def _abort(self, error: BaseException) -> None:
        """End the session with ``error`` and close at once."""
        if self.session.error is None:
            self.session.lost(error)
            self._end(Ended(error))

    def _abandon(self) -> None:
        """Give the connection up at once (a failed login, say); a session that ended is
        closing already, its goodbye (an ERROR frame) on the way."""
        if not self._lost and not self.session.ended:
            self._drop(abort=True)

    # -- for the transport's glue ---------------------------------------------------------------

    def _transport_opened(self) -> None:
        self._opened = True
        self._run(self.session.start(self._now()))
        if not self.opening_exchange and not self._lost and not self.session.ended:
            self._ready()

    def _transport_data(self, unit: Any) -> None:
        if self._lost:
            return
        self._run(self.session.receive(unit, self._now()))

    def _transport_lost(self, reason: Failure | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._cancel_timer()
        if self.session.error is None:
            text = reason.getErrorMessage() if reason is not None else "connection lost"
            self.session.lost(self.session.closed_error(text))
        self._fail_pending(self.session.pending_error())
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self.session.error or self.session.closed())

    def _write(self, unit: Any) -> None:
        raise NotImplementedError

    def _drop(self, abort: bool) -> None:
        raise NotImplementedError

    # -- plumbing ----------------------------------------------------------------------------

    def _run(self, events: list[Any]) -> None:
        """Send what the session wrote, then handle ``events``, then set the timer."""
        self._flush()
        for event in events:
            if isinstance(event, Answered):
                d = self._pending.pop(event.token, None)
                if d is not None:
                    d.callback(event.value)
            elif isinstance(event, Failed):
                d = self._pending.pop(event.token, None)
                if d is not None:
                    d.errback(event.error)
            elif isinstance(event, Ended):
                self._end(event)
            else:
                self._dispatch(event)
        self._flush()
        self._schedule()

    def _end(self, ended: Ended) -> None:
        self.log.info("{client} closing the connection: {reason}",
                      client=self.client_name, reason=ended.error)  # fmt: skip
        self._flush()  # a goodbye (an ERROR frame), before anyone reacts
        self._cancel_timer()
        if not self._lost:
            self._drop(abort=ended.abort)
        self._fail_pending(self.session.pending_error())

    def _fail_pending(self, error: BaseException) -> None:
        """Fail what is pending with ``error`` (a subclass extends it with its own waiters)."""
        pending, self._pending = self._pending, {}
        for d in pending.values():
            d.errback(error)
        if not self._is_ready:
            waiters, self._ready_waiters = self._ready_waiters, []
            for ready in waiters:
                ready.errback(self.session.error or error)

    def _flush(self) -> None:
        """Send what the session wrote, once the transport is open (until then the session
        keeps it: a WebSocket carries nothing before its handshake)."""
        if self._lost or not self._opened:
            return
        for unit in self.session.outgoing():
            self._write(unit)

    def _schedule(self) -> None:
        due = None if self._lost or self.session.ended else self.session.next_tick()
        timer = self._timer
        if due is None:
            self._cancel_timer()
        elif timer is None or not timer.active() or timer.getTime() != due:
            self._cancel_timer()
            self._timer = self._clock().callLater(max(due - self._now(), 0.0), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self._lost:
            self._run(self.session.tick(self._now()))

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()


class StreamClientProtocol(SessionDriver, Protocol):
    """A :class:`SessionDriver` on a stream transport (TCP, TLS, a unix stream): the units
    are bytes."""

    transport: Any  # an ITransport; typed loosely as Twisted's interfaces confuse mypy

    def connectionMade(self) -> None:
        self._transport_opened()

    def dataReceived(self, data: bytes) -> None:
        self._transport_data(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._transport_lost(reason)

    def _write(self, unit: Any) -> None:
        self.transport.write(unit)

    def _drop(self, abort: bool) -> None:
        if abort and hasattr(self.transport, "abortConnection"):
            self.transport.abortConnection()
        else:
            self.transport.loseConnection()


class ClientFactory(Factory):
    """Builds ``protocol_class(**options)`` (default: the class's :attr:`protocol`)."""

    def __init__(self, protocol_class: Any = None, **options: Any) -> None:
        self.protocol_class: Any = protocol_class or self.protocol
        self.options = options

    def buildProtocol(self, addr: Any) -> Any:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto


def client_endpoint(
    reactor: Any, endpoint_or_host: Any, port: int, *, tls: Any = None, timeout: float = 30.0
) -> Any:
    """Where to connect: ``endpoint_or_host`` as it is when it is an
    ``IStreamClientEndpoint``, else TCP to that host and ``port``. ``tls``: None or False
    for none, True to verify the server against the system's CAs as ``endpoint_or_host``,
    or a client connection creator (:func:`~msgbroker.clientkit.tls.client_tls_options`);
    TLS runs on ``reactor``, not the global one."""
    if IStreamClientEndpoint.providedBy(endpoint_or_host):
        endpoint = endpoint_or_host
    else:
        endpoint = HostnameEndpoint(reactor, endpoint_or_host, port, timeout=timeout)
        if tls is True:
            tls = client_tls_options(endpoint_or_host)
    if tls is not None and tls is not False:
        endpoint = TLSClientEndpoint(tls, endpoint, reactor)
    return endpoint


@defer.inlineCallbacks
def connect_client(
    endpoint: Any, factory: Any, prepare: Callable[[Any], Any] | None = None
) -> Any:
    """Connect ``factory``'s protocol through ``endpoint``, then ``prepare(proto)`` (a
    Deferred: the opening exchange, a login); a Deferred of the protocol. When ``prepare``
    fails the connection is given up and the failure passed on."""
    proto = yield endpoint.connect(factory)
    if prepare is not None:
        try:
            yield prepare(proto)
        except BaseException:
            proto._abandon()
            raise
    return proto


def _first_failure(failure: Failure) -> Failure:
    error = failure.value
    if isinstance(error, defer.FirstError):
        first: Failure = error.subFailure
        return first
    return failure
