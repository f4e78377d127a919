"""The Broker: configuration, hub, plugins, auth schemes and protocols in one object.

Protocols talk to the broker (``open_session``, ``authenticate``, ``authorize``,
``session_closed``) and to its ``hub`` for routing. A custom server subclasses
:class:`Broker` and overrides its documented methods, or defines ``msgbroker_*`` methods:
the broker registers itself as a plugin, so those act as hook implementations (subclass
hooks) without any decorator. What plugins register (protocols, auth schemes, engines)
and which of it the configuration picks is :mod:`msgbroker.registry`'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from .auth import AuthResult, AuthScheme, Deny, LoginRequest
from .config import BrokerConfig, Listener, resolve_sections
from .engine import ClusterSettings, EngineSpec
from .errors import ConfigError, LimitExceeded
from .hooks import Plugins
from .hub import Hub, HubLimits, Peer
from .limits import ConnectionLimits, LoginThrottle, RateLimitedLog
from .logins import WaitingLogins, start_login
from .memory import Trimmer, resident_bytes
from .message import Encoder, Message, MessageRun, RouteResult
from .nodes import node_name
from .output import Batcher, Output, OutputBudget, OutputPolicy
from .pluginmanager import build_plugin_manager
from .reasons import CloseReason
from .registry import ProtocolSpec, add_by_name, add_engine, enabled_schemes, engine_for
from .reloading import keep_restart_only
from .reloading import prepare as prepare_reload
from .session import Link, Session
from .stats import BrokerCounters, Traffic
from .timers import TimerQueue
from .tls import ServerTLS

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from .cluster import Cluster

log = Logger(namespace="msgbroker")


class Broker:
    """One broker. ``reactor`` is used for timers (pass a ``Clock`` in tests); ``plugins``
    are plugin objects or modules registered after the built-ins and entry points."""

    #: lets :class:`msgbroker.pluginmanager.PluginManager` treat ``msgbroker_*`` methods as hooks
    _msgbroker_subclass_hooks = True

    def __init__(
        self, config: BrokerConfig | None = None, reactor: Any = None, plugins: Iterable[Any] = ()
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self.config = config = config or BrokerConfig()
        self.reactor = reactor
        self.hub = Hub(
            HubLimits(
                max_subscriptions=config.max_subscriptions,
                max_topics=config.max_topics,
                queue_backlog=config.mm2_queue_backlog,
            )
        )
        self.connections = ConnectionLimits(
            config.max_connections, config.max_connections_per_address
        )
        self.login_throttle = LoginThrottle(config.login_attempts)
        #: logins waiting for a check from their address to end (logins.py)
        self.waiting_logins = WaitingLogins()
        #: one info line per limit (per slow-consumer kind, per address whose logins
        #: fail) per 10 s, and one more when the 10 s end, with a count
        self.rate_limited_log = RateLimitedLog(_log_info, later=reactor.callLater)
        #: hands freed heap back to the system after large releases
        self.trimmer = Trimmer(reactor, _log_trim)
        self.hub.on_release = self.trimmer.released
        #: output is written once per recipient per batch: at the end of each reactor turn
        self.batcher = Batcher(reactor)
        #: every connection's timers (login timeout, keepalive...): one reactor call for the
        #: earliest, and the batch flushed after the due ones ran
        self.session_timers = TimerQueue(reactor.seconds)
        self.session_timers.run_on(reactor, after_tick=self.batcher.flush)
        #: bound once, for every session (a bound method is 64 bytes per connection)
        self._slow_consumer_dropped = self.slow_consumer_dropped
        #: open sessions in the order they connected (a dict used as an ordered set)
        self.sessions: dict[Session, None] = {}
        #: logins, closes by reason, traffic per protocol (:mod:`msgbroker.stats`)
        self.counters = BrokerCounters()
        self._session_ids = itertools.count(1)
        #: when this broker was made, on its clock (``reactor.seconds()``)
        self.started_at: float = reactor.seconds()
        #: (listener, bound address text), filled by the service as listeners bind
        self.listening: list[tuple[Listener, str]] = []
        self.policy = OutputPolicy(
            max_backlog=self.config.max_backlog, drop=self.config.slow_consumer == "drop"
        )
        #: all slow consumers' backlogs together; letting go of a large one trims the heap
        self.output_budget = OutputBudget(config.max_output, self.trimmer.released)
        #: the pluggy manager underneath :attr:`plugins`; call hooks through ``plugins``
        self.pm = build_plugin_manager(
            self.config.plugins, self.config.no_plugins, extra=[self, *plugins]
        )
        #: the broker's plugins: typed hook calls, finding a plugin, per-broker state
        self.plugins = Plugins(self.pm)
        # the plugins' sections ([journal], ...) become their settings objects
        self.config = resolve_sections(self.config, self.plugins.config_sections())
        self.protocols: dict[str, ProtocolSpec] = {}
        self.plugins.register_protocols(add_by_name(self.protocols, "protocol"))
        self.schemes: dict[str, AuthScheme] = {}
        self.plugins.register_auth_schemes(
            add_by_name(self.schemes, "auth scheme"), self.config, self
        )
        self.enabled_schemes = self.enabled_schemes_for(self.config)
        #: this broker's name among several (:mod:`msgbroker.nodes`): ``--node-name``, or
        #: the host name and the first listener's port. A default whose port is 0 becomes
        #: the bound port when the service has bound it, before ``msgbroker_broker_started``
        self.node_name: str = node_name(self.config, self.listeners())
        #: engines by the URL schemes that pick them (``msgbroker_register_engines``)
        self.engines: dict[str, EngineSpec] = {}
        self.plugins.register_engines(add_engine(self.engines))
        self.engine = engine_for(self.engines, self.cluster_settings)
        #: this node of a cluster, made at start for an engine other than ``memory``
        self.cluster: Cluster | None = None
        #: the TLS listeners' server context, made by :meth:`server_tls` for the first one
        self.tls: ServerTLS | None = None
        self._bind_hooks()

    # -- registration (registry.py) ---------------------------------------------------------

    @property
    def cluster_settings(self) -> ClusterSettings:
        """The ``[cluster]`` section (defaults when no plugin declares it)."""
        settings = self.config.plugin_settings.get("cluster")
        return settings if isinstance(settings, ClusterSettings) else ClusterSettings()

    def enabled_schemes_for(self, config: BrokerConfig, warn: bool = True) -> tuple[str, ...]:
        """The auth schemes ``config`` enables on this broker; ConfigError for one that is
        unknown or cannot work (:func:`msgbroker.registry.enabled_schemes`)."""
        return enabled_schemes(config, self.schemes, self.listeners(), warn)

    def _bind_hooks(self) -> None:
        """Resolve which observation hooks have implementations (hot-path rule)."""
        hooks = self.plugins.bind()
        self._authorize = hooks.authorize
        self._authorize_per_topic = hooks.authorize_per_topic
        self._authenticate = hooks.authenticate
        self._opened = hooks.session_opened
        self._closed = hooks.session_closed
        self._login = hooks.session_login
        # may run again (a plugin registered at start); start from "nobody observes"
        self.hub.observer = None
        # what protocols remembered of the routes (msgbroker.routecache) may now miss an
        # observer or an authorize hook
        self.hub.generation += 1
        self.hub.run_observer = None
        routed = hooks.message_routed
        if routed is not None:

            def observe(message: Message, result: RouteResult) -> None:
                routed(message=message, result=result)

            self.hub.observer = observe
            run_routed = hooks.run_routed
            if run_routed is not None:

                def observe_run(run: MessageRun, result: RouteResult) -> None:
                    run_routed(run=run, result=result)

                self.hub.run_observer = observe_run
        self.hub.on_skip = self._log_skip
        self.hub.on_limit = self._log_limit

    def add_plugin(self, plugin: Any, name: str | None = None) -> None:
        """Register ``plugin`` with this running broker, as if it had been there from the
        start for every hook called from now on: the hot path's hooks are resolved again
        (a plugin that starts with the broker, like the journal, registers its observer
        from ``msgbroker_broker_started``). Registration hooks (protocols, auth schemes,
        configuration sections) have been called already. A hook it implements that nobody
        declares is a :class:`ConfigError`."""
        self.plugins.register(plugin, name=name)
        self._bind_hooks()

    def remove_plugin(self, plugin: Any = None, name: str | None = None) -> Any:
        """Unregister a plugin (by object or by name) and resolve the hooks again; returns it."""
        removed = self.plugins.unregister(plugin, name=name)
        self._bind_hooks()
        return removed

    def server_tls(self) -> ServerTLS:
        """The server context every TLS listener makes its connections with (from
        ``--tls-cert``, ``--tls-key`` and ``--tls-ca``; a reload replaces what it holds)."""
        if self.tls is None:
            config = self.config
            if not (config.tls_cert and config.tls_key):
                raise ConfigError("a TLS listener needs --tls-cert and --tls-key")
            self.tls = ServerTLS.load(config.tls_cert, config.tls_key, config.tls_ca)
        return self.tls

    def reload(self, config: BrokerConfig) -> None:
        """Take a configuration read again (SIGHUP): ``config`` is the whole new one.
        Every participant checks what it needs first — the framework (auth schemes, TLS
        files; :mod:`msgbroker.reloading`), then each ``msgbroker_reload`` implementation
        (its files, its section) — and when any refuses, :class:`ConfigError` is raised and
        nothing has changed. Otherwise each puts its new settings in place, in
        registration order, and ``config`` becomes :attr:`config`. Existing connections stay
        open; settings that shaped what was built at start keep their running values
        (:data:`msgbroker.reloading.RESTART_ONLY`, named in one log line when changed)."""
        config, restart_only = keep_restart_only(self.config, config.validate())
        config = resolve_sections(config, self.plugins.config_sections())
        commits = [prepare_reload(self, config), *self.plugins.reload(self, config)]
        for commit in commits:
            commit()
        self.config = config
        if restart_only:
            log.warn(
                "changed in the configuration, but only a restart applies it: {names}",
                names=", ".join(restart_only),
            )

    def listeners(self) -> tuple[Listener, ...]:
        """The configured listeners, or every protocol's default endpoint."""
        if self.config.listeners:
            return self.config.listeners
        return tuple(
            Listener(spec.name, spec.default_endpoint)
            for spec in self.protocols.values()
            if spec.default_endpoint is not None
        )

    # -- sessions ----------------------------------------------------------------------------

    def admit(self, address: Any) -> bool:
        """Whether a new connection from ``address`` (a Twisted address; unix peers have no
        host) is within the connection limits. A protocol factory asks before it builds a
        protocol and returns None when refused, so Twisted closes the socket at once,
        before any login. Refusals are counted and logged (rate-limited)."""
        host = getattr(address, "host", "") or ""
        limit = self.connections.refusal(host)
        if limit is None:
            return True
        self.limited(limit, f"refused a connection from {host or 'a local peer'}")
        return False

    def limited(self, limit: str, what: str) -> None:
        """Count a request ``limit`` (a setting's name) refused, and say so at info level at
        most once per 10 s per limit."""
        self.hub.stats.refused += 1
        self.rate_limited_log(limit, self.reactor.seconds(), f"{limit} reached: {what}")

    def open_session(
        self,
        protocol: str,
        encode: Encoder,
        link: Link,
        make_output: Callable[[Session], Output],
        host: str = "",
        tls_names: frozenset[str] | None = None,
    ) -> Session:
        """A new session for a connection just made, writing through the output
        ``make_output(session)`` returns (calls ``msgbroker_session_opened``)."""
        session = Session(
            protocol=protocol,
            encode=encode,
            stats=self.hub.stats,
            link=link,
            host=host,
            tls_names=tls_names,
            on_dropped=self._slow_consumer_dropped,
            id=next(self._session_ids),
            opened_at=self.reactor.seconds(),
        )
        session.attach(make_output(session))
        self.sessions[session] = None
        self.counters.opened(session)
        self.connections.opened(host)
        if self._opened is not None:
            self._opened(session=session)
        return session

    def session_closed(self, session: Session, reason: CloseReason) -> None:
        """The connection is gone: leave the hub (presence events) and tell the plugins."""
        if session not in self.sessions:
            return
        del self.sessions[session]
        self.connections.closed(session.host)
        session.output.stop()  # nothing is written to it any more; it leaves the budget
        if session.close_reason is None:
            session.close_reason = reason
        self.counters.ended(session, session.close_reason)
        if session.close_reason is CloseReason.SLOW_CONSUMER or len(session.subscriptions) >= 1000:
            self.trimmer.released()
        else:
            self.trimmer.closed()
        self.hub.close(session)
        self.batcher.flush()  # its UNSUBSCRIBE events go out now
        if session.close_reason is CloseReason.SLOW_CONSUMER:
            self.rate_limited_log(
                f"slow-close {session.protocol} {session.host}",
                self.reactor.seconds(),
                f"slow {session.protocol} consumer {session.identity or '-'} "
                f"({session.host or 'local'}) disconnected: it did not read its output "
                f"({session.dropped} deliveries it could not take)",
            )
        if self._closed is not None:
            self._closed(session=session, reason=session.close_reason)

    # -- decisions -------------------------------------------------------------------------

    def authenticate(self, request: LoginRequest) -> AuthResult | Deferred[AuthResult]:
        """Decide a login: disabled scheme -> Deny; then ``msgbroker_authenticate``; then the
        scheme itself, which may answer later (a Deferred). Overridable."""
        if request.scheme not in self.enabled_schemes:
            return Deny(f"scheme {request.scheme!r} is not enabled")
        if request.scheme == "open" and not self.config.auth and not request.is_loopback:
            return Deny("open login is for loopback peers only in the default configuration")
        if self._authenticate is not None:
            decided = self._authenticate(request=request)
            if decided is not None:
                return decided
        return self.schemes[request.scheme].authenticate(request)

    def login(self, session: Session, request: LoginRequest) -> AuthResult:
        """Decide a login at once: :meth:`begin_login` for a protocol that cannot wait.
        A scheme that answers later (``password``) is refused here."""
        results: list[AuthResult] = []
        start_login(self, session, request, results.append, wait=False)
        return results[0]

    def begin_login(
        self, session: Session, request: LoginRequest, decided: Callable[[AuthResult], None]
    ) -> None:
        """Decide a login and call ``decided(result)`` once: before returning when the
        scheme answers at once, later on the reactor when it answers with a Deferred (the
        ``password`` scheme verifies its hash in a thread). When accepted, the identity is
        registered in the hub (kicking an older holder) before ``decided`` is called;
        ``msgbroker_session_login`` is called either way. A session that closed before a
        late answer is not called back (nor logged in). Meanwhile the protocol handles
        nothing else the peer sent (requests take effect in order)."""
        start_login(self, session, request, decided, wait=True)

    def authorize(self, session: Session, action: str, topic: str | None) -> bool:
        """``msgbroker_authorize``; allowed when no plugin implements it or all abstain."""
        if self._authorize is None:
            return True
        return self._authorize(session=session, action=action, topic=topic) is not False

    @property
    def authorizes(self) -> bool:
        """True when some plugin implements ``msgbroker_authorize`` (protocols skip the call
        otherwise)."""
        return self._authorize is not None

    @property
    def authorizes_per_topic(self) -> bool:
        """True when every ``msgbroker_authorize`` implementation decides per topic
        (:func:`msgbroker.per_topic`): one answer then stands for a run of requests with
        the same session, action and topic, and for that topic until ``hub.generation``
        changes. False without an implementation (nothing to ask)."""
        return self._authorize_per_topic

    # -- plumbing ----------------------------------------------------------------------------

    def _log_skip(self, peer: Peer, message: Message) -> None:
        log.debug(
            "skipped {protocol} recipient {identity}: cannot carry {kind} on {topic!r}",
            protocol=peer.protocol,
            identity=peer.identity,
            kind=message.kind.value,
            topic=message.topic,
        )

    def slow_consumer_dropped(self, session: Session, count: int) -> None:
        """``count`` deliveries to ``session`` were discarded by its slow-consumer policy:
        one info line per 10 s per protocol says so (with how many more). A slow
        consumer's disconnect is logged when its session closes (:meth:`session_closed`)."""
        self.rate_limited_log(
            f"slow-drop {session.protocol}",
            self.reactor.seconds(),
            f"slow {session.protocol} consumer {session.identity or '-'} "
            f"({session.host or 'local'}): {count} deliveries dropped "
            f"({session.dropped} in all)",
        )

    def _log_limit(self, peer: Peer, error: LimitExceeded) -> None:
        host = getattr(peer, "host", "") or "local"
        self.rate_limited_log(
            error.limit,
            self.reactor.seconds(),
            f"{error}: refused a {peer.protocol} request from {peer.identity} ({host})",
        )

    def traffic(self) -> dict[str, Traffic]:
        """Per protocol: connections opened, bytes and messages in and out since the broker
        started (the open sessions' counters added up now: call it per scrape, not per
        message)."""
        return self.counters.traffic(self.sessions)

    def status(self) -> str:
        """One line on what the broker holds now (``SIGUSR1`` logs it)."""
        hub, stats = self.hub, self.hub.stats
        return (
            f"{len(self.sessions)} connections, {len(hub.identities)} identities, "
            f"{len(hub.topics)} topics, {len(hub.patterns)} patterns, "
            f"{self.output_budget.total} bytes queued for {len(self.output_budget.members)} "
            f"slow consumers; routed {stats.routed}, delivered {stats.delivered}, "
            f"dropped {stats.dropped}, skipped {stats.skipped}, refused {stats.refused}; "
            f"resident memory {resident_bytes() >> 20} MiB{self._cluster_status()}"
        )

    def _cluster_status(self) -> str:
        cluster = self.cluster
        if cluster is None:
            return ""
        counters = cluster.counters
        return (
            f"; cluster: node {cluster.node}, "
            f"{'connected' if cluster.connected else 'not connected'}, "
            f"{len(cluster.view.nodes)} other nodes, messages out {counters.messages_out}, "
            f"in {counters.messages_in}, dropped {counters.dropped}, skipped {counters.skipped}"
        )

    def started(self) -> None:
        self.start_cluster()
        self.plugins.broker_started(self)

    def start_cluster(self) -> None:
        """Join the cluster ``--cluster`` names (nothing for the memory engine); the engine
        connects in the background, local clients are served meanwhile."""
        spec = self.engine
        if spec is None or self.cluster is not None:
            return
        from .cluster import Cluster

        self.cluster = Cluster.join(self, spec, self.cluster_settings, self.node_name)
        if self.cluster is not None:
            self.cluster.start()

    def stop_cluster(self) -> Deferred[None]:
        """Leave the cluster (at shutdown, once the sessions are gone)."""
        from twisted.internet.defer import succeed

        cluster, self.cluster = self.cluster, None
        if cluster is None:
            return succeed(None)
        return cluster.stop()

    def stopping(self) -> None:
        """The service begins to stop (``msgbroker_broker_stopping``)."""
        self.plugins.broker_stopping(self)

    def retire(self, session: Session) -> None:
        """Shutdown: ``session`` leaves the routing core (its presence events reach the
        sessions still in it) and handles no more input (its close reason is shutdown), but
        keeps its output, which the service lets flush before it closes the connection.
        :meth:`session_closed` does the rest when the connection is gone."""
        if session.close_reason is None:
            session.close_reason = CloseReason.SHUTDOWN
        self.hub.close(session)

    def stopped(self) -> None:
        self.trimmer.cancel()
        self.rate_limited_log.flush()  # the counts of bursts still being counted
        self.plugins.broker_stopped(self)


def _log_info(text: str, more: int) -> None:
    if more:
        log.info("{text} (and {more} more like it since the last line)", text=text, more=more)
    else:
        log.info("{text}", text=text)


def _log_trim(before: int, after: int) -> None:
    log.info(
        "memory handed back after a large release: resident {before} MiB -> {after} MiB",
        before=before >> 20,
        after=after >> 20,
    )
