"""Engines: how the nodes of a cluster reach each other (public API).

A broker alone is one node: the ``memory`` engine, the default, which adds nothing to
routing (the hub's ``cluster`` stays ``None``: not one call per message). ``--cluster URL``
picks another engine by the URL's scheme (``redis://``, ``rediss://``; a third party's
through ``msgbroker_register_engines``); the broker then makes a
:class:`msgbroker.cluster.Cluster`, which does everything every engine needs done the same
way — what crosses nodes and when, the replicated view of the other nodes (their interest,
identities, presence members), node liveness from heartbeats, counters — and talks to the
engine only through the small :class:`Engine` interface below. The engine moves opaque
bytes: publications on per-topic channels, messages to one node, announcements to every
node, and this node's state where a node that (re)connects can read it.

An engine plugin::

    @hookimpl
    def msgbroker_register_engines(register):
        register(EngineSpec("redis", ("redis", "rediss"), build=RedisEngine, description=...))

``build(context)`` gets an :class:`EngineContext` and returns the :class:`Engine` (or
``None``: no cluster, the memory engine's answer). Nothing here imports Twisted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from attrs import frozen

from .errors import ConfigError

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

__all__ = [
    "ClusterSettings",
    "Engine",
    "EngineContext",
    "EngineEvents",
    "EngineSpec",
    "NodeState",
    "QueueStore",
    "queue_store",
    "redact_url",
    "url_scheme",
]

#: a node's state as an engine stores it: field -> value (opaque bytes, made and read by
#: :mod:`msgbroker.clusterwire`); a value of ``None`` in a change deletes the field
NodeState = Mapping[bytes, bytes]


@frozen
class ClusterSettings:
    """The ``[cluster]`` section (and ``--cluster URL``): which engine, and how it behaves.

    ``heartbeat``: seconds between a node's heartbeats; ``node_timeout``: a node not heard
    from for this long is gone (0: 1.5 heartbeats, so that with the checks every quarter
    heartbeat a dead node is seen gone within 2 heartbeats); ``connect_timeout``: seconds
    a connection to the engine may take; ``max_buffer``: bytes held for the engine while it
    does not keep up (past it, what would cross is dropped and counted); ``prefix``: of
    every channel and key the engine uses (several clusters on one server). ``password``
    or ``password_file`` and the ``tls_*`` files are for engines that need them.

    Queue groups across nodes (engines with a :class:`QueueStore`): ``queue_redeliver_after``
    seconds after a member or a node last held a message it never acknowledged, another
    member gets it; each group's store holds at most about ``queue_max_length`` messages
    (the oldest go); ``durable_queues`` names the groups (``"*"``: all) whose messages
    outlive their members and the nodes."""

    url: str = ""
    heartbeat: float = 1.0
    node_timeout: float = 0.0
    connect_timeout: float = 5.0
    max_buffer: int = 16 << 20
    prefix: str = "msgbroker"
    password: str | None = None
    password_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    queue_redeliver_after: float = 30.0
    queue_max_length: int = 100_000
    durable_queues: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if not self.heartbeat > 0:
            raise ConfigError(f"cluster-heartbeat must be positive, not {self.heartbeat}")
        if self.node_timeout < 0:
            raise ConfigError(f"cluster-node-timeout must be 0 or more, not {self.node_timeout}")
        if self.node_timeout and self.node_timeout < self.heartbeat:
            raise ConfigError(
                f"cluster-node-timeout ({self.node_timeout:g}) must be at least one "
                f"heartbeat ({self.heartbeat:g})"
            )
        if not self.connect_timeout > 0:
            raise ConfigError("cluster-connect-timeout must be positive")
        if self.max_buffer < 1:
            raise ConfigError(f"cluster-max-buffer must be at least 1, not {self.max_buffer}")
        if self.password is not None and self.password_file is not None:
            raise ConfigError("give cluster-password or cluster-password-file, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("cluster-tls-cert and cluster-tls-key go together")
        if not self.queue_redeliver_after >= 0.05:
            raise ConfigError(
                f"cluster-queue-redeliver-after must be at least 0.05 s, "
                f"not {self.queue_redeliver_after}"
            )
        if self.queue_max_length < 1:
            raise ConfigError(
                f"cluster-queue-max-length must be at least 1, not {self.queue_max_length}"
            )
        if self.url and not url_scheme(self.url):
            raise ConfigError(f"--cluster needs a URL such as redis://HOST:PORT, not {self.url!r}")

    def durable(self, group: str) -> bool:
        """Whether the queue group ``group`` (of any topic) is durable."""
        names = self.durable_queues
        return bool(names) and (group in names or "*" in names)

    @property
    def timeout(self) -> float:
        """Seconds without a heartbeat after which a node is gone."""
        return self.node_timeout or 1.5 * self.heartbeat

    def read_password(self) -> str | None:
        """The password: given, or the first line of ``password_file`` (ConfigError when
        that cannot be read); ``None`` when neither is set (the URL may hold one)."""
        if self.password_file is None:
            return self.password
        try:
            with open(self.password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(
                f"cannot read cluster-password-file {self.password_file}: {e.strerror}"
            ) from None


def url_scheme(url: str) -> str:
    """The scheme of an engine URL (``redis`` of ``redis://host:6379``); ``memory`` for
    an empty URL."""
    if not url:
        return "memory"
    scheme, sep, _ = url.partition(":")
    return scheme.lower() if sep and scheme.isascii() and scheme.replace("+", "").isalnum() else ""


def redact_url(url: str) -> str:
    """``url`` without its password, for logs (``redis://:***@host:6379``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class EngineEvents(Protocol):
    """What an engine calls back (the :class:`msgbroker.cluster.Cluster` provides it). All
    on the reactor thread."""

    def engine_connected(self) -> None:
        """The engine is (again) connected and listens on every channel it was asked to
        (the node's own, the announcements', every topic of :meth:`Engine.listen`). The
        cluster then stores its whole state again, announces itself and reads the others'."""

    def engine_lost(self, reason: str) -> None:
        """The connection is gone; the engine reconnects with backoff by itself."""

    def delivered(self, data: bytes) -> None:
        """A publication on a topic this node listens on, or a message to this node."""

    def announced(self, data: bytes) -> None:
        """An announcement (any node's, this node's own included, in the one order every
        node sees them in)."""

    def chunk_done(self) -> None:
        """The engine handed over everything one read held: deliveries are written now."""

    def skipped(self, what: str) -> None:
        """The engine skipped malformed input of its own (not a publication or an
        announcement, which the cluster reads itself: a state request or reply, say):
        ``what`` names it. Counted with the cluster's ``skipped`` (``/metrics``) and logged
        (one line per 10 s)."""


class Engine(Protocol):
    """What an engine does for its node. Every method returns at once (never blocks the
    reactor): output is buffered and written by :meth:`flush`, one write for all of it.
    ``publish``, ``send`` and ``announce`` return False when they could not take the data
    (not connected, or ``max_buffer`` bytes already wait): the cluster counts what was lost."""

    def start(self) -> None:
        """Connect, and keep reconnecting with backoff; call ``engine_connected`` each time."""

    def stop(self) -> Deferred[None]:
        """Leave: delete this node's state and liveness, write what is buffered, close."""

    def listen(self, topic: str) -> None:
        """Receive what is published on ``topic`` from now on (kept across reconnects)."""

    def unlisten(self, topic: str) -> None:
        """Stop receiving ``topic``."""

    def publish(self, topic: str, data: bytes) -> bool:
        """To every node that listens on ``topic``."""

    def send(self, node: str, data: bytes) -> bool:
        """To one node."""

    def announce(self, data: bytes, changes: Sequence[tuple[bytes, bytes | None]]) -> bool:
        """To every node, this one too; first applies ``changes`` to this node's stored state
        (field -> value; ``None`` deletes), so a node that reads it later sees them."""

    def replace_state(self, state: NodeState) -> bool:
        """This node's whole stored state is ``state`` (after a (re)connect)."""

    def beat(self) -> None:
        """Say this node is alive (an expiring key, ...): called every heartbeat."""

    def snapshot(self, nodes: Sequence[str] | None = None) -> Deferred[dict[str, NodeState]]:
        """The stored state of the given nodes (``None``: every live node but this one)
        that have one: node name -> state. A node whose state is missing is left out."""

    def flush(self) -> None:
        """Write what is buffered (one write)."""

    def status(self) -> Mapping[str, Any]:
        """For metrics and logs: at least ``connected`` (bool) and ``buffered`` (bytes)."""


#: a queue group across nodes: (topic, group name)
QueueKey = tuple[str, str]
#: an entry of a queue's store: (its id in the store, the message's bytes)
QueueEntry = tuple[bytes, bytes]


@runtime_checkable
class QueueStore(Protocol):
    r"""An optional capability of an engine: Micromessage2 queue groups across nodes. An
    engine that has one returns it from a method ``queue_store()`` (see
    :func:`queue_store`); the cluster refuses queue subscriptions on an engine without.

    Each group (topic, name) is a store of entries shared by the nodes with members in it
    (on Redis, a stream and its consumer group): a publishing node :meth:`add`\ s each
    message once; a node with members :meth:`read`\ s what no node took yet, as much as its
    members have room for, and :meth:`ack`\ s what they acknowledged; what a node took and
    neither acknowledged nor :meth:`touch`\ ed for ``queue_redeliver_after`` seconds, any
    node may :meth:`claim`. Every method returns at once; commands are written with the
    engine's next ``flush``. The reading methods fail (errback) while the engine is away."""

    def open(self, key: QueueKey, durable: bool, wake: Callable[[], None]) -> None:
        """This node has members in the group: make its store when there is none (durable:
        remember it for nodes that start later), and call ``wake`` whenever entries are
        added to it, by any node. Kept across reconnects (made again: the engine may have
        restarted empty)."""

    def close(self, key: QueueKey) -> None:
        """This node has no member in the group any more: no more ``wake``. A group that is
        not durable is deleted, with what it holds, once no node has members in it (the
        store decides, in one step with the nodes that open it meanwhile); one whose nodes
        died expires when none has kept it (:meth:`keep`) for a while."""

    def add(self, key: QueueKey, entries: Sequence[bytes], missing: Callable[[], None]) -> bool:
        """Append messages to the group's store and wake its readers; when the group has no
        store (deleted), nothing is added and ``missing`` is called. False when the engine
        could not take them (away, or its buffer full)."""

    def read(self, key: QueueKey, count: int) -> Deferred[list[QueueEntry]]:
        """Up to ``count`` entries no node took yet; this node has them from now on."""

    def claim(self, key: QueueKey, count: int) -> Deferred[list[QueueEntry]]:
        """Up to ``count`` entries some node took and left untouched for
        ``queue_redeliver_after`` seconds; this node has them from now on."""

    def ack(self, key: QueueKey, ids: Sequence[bytes]) -> None:
        """These entries are done: never delivered again."""

    def touch(self, key: QueueKey, ids: Sequence[bytes]) -> None:
        """This node still holds these entries: their ``queue_redeliver_after`` starts
        again now (a lease renewed; also what gives entries back, by no longer renewing)."""

    def keep(self, key: QueueKey, durable: bool) -> None:
        """Called by the nodes with members, every few seconds: drop what is done; a group
        that is not durable expires when no node with members keeps it any more."""

    def durables(self) -> Deferred[list[QueueKey]]:
        """The durable groups any node opened (they take messages without members)."""


def queue_store(engine: Any) -> QueueStore | None:
    """``engine``'s :class:`QueueStore`, or ``None`` when it has none."""
    get = getattr(engine, "queue_store", None)
    store = get() if callable(get) else None
    return store if isinstance(store, QueueStore) else None


@frozen
class EngineContext:
    """What an engine is built with: the node's name, the parsed ``[cluster]`` settings,
    the URL, the reactor, who to call back, and a rate-limited logger for its troubles
    (``log(key, text)``: one line per key per 10 s)."""

    node: str
    url: str
    settings: ClusterSettings
    reactor: Any
    events: EngineEvents
    log: Callable[[str, str], None]


@frozen
class EngineSpec:
    """An engine, as a plugin registers it (``msgbroker_register_engines``): its name, the
    URL schemes that pick it, and ``build(context) -> Engine | None``.

    ``ordered``: every node sees all nodes' announcements in one order (Redis pub/sub on
    one server); False when only each node's own announcements keep their order (NATS),
    so that two nodes claiming one identity at once settle it by node name instead.
    ``no_queue_groups``: why this engine cannot carry MM2 queue groups across nodes (it
    has no :class:`QueueStore`): the text a queue subscription is refused with ('': a
    general one)."""

    name: str
    schemes: tuple[str, ...]
    build: Callable[[EngineContext], Engine | None]
    description: str = ""
    ordered: bool = True
    no_queue_groups: str = ""
