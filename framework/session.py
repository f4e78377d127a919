"""Per-connection state shared by every protocol, and its output budget.

A :class:`Session` is what the hub knows of a connection. Its ``send`` attribute is what the
hub calls per delivery: while the transport keeps up it *is* ``transport.write`` (no extra
Python frame on the hot path; the transport coalesces writes into one ``send`` per reactor
turn). The session registers itself as the transport's streaming producer, so when the
transport's buffer passes its high-water mark Twisted calls :meth:`Session.pauseProducing`,
and only then does ``send`` switch to the slow-consumer path: a byte budget
(``max_backlog``) past which the policy applies — ``drop`` (count and discard) or
``disconnect`` (abort the connection; the hub sends the UNSUBSCRIBE events). Nobody else
waits: the publisher and the other recipients never see the slow one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attrs import define, field, frozen
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from .message import Encoder

if TYPE_CHECKING:
    from .hub import HubStats, Topic


@frozen
class OutputPolicy:
    """What a session does with output its peer does not read.

    ``max_backlog``: bytes the broker holds for a peer beyond the transport's own
    high-water mark (Twisted's 64 KiB ``bufferSize``); the kernel's socket buffers come on
    top. ``drop``: past the budget, discard (and count) instead of disconnecting.
    """

    max_backlog: int = 16 << 20
    drop: bool = False


#: a backlog at least this large, let go at once, is worth handing back to the system
LARGE_RELEASE = 1 << 20


class OutputBudget:
    """The bytes queued for *all* slow consumers together (``max-output``).

    A per-connection bound alone lets many slow readers take all memory (100 of them at
    16 MiB each is 1.6 GB). Members are the sessions (and sbus outboxes) currently
    holding a backlog; each reports its backlog as it changes (:meth:`update`). When a
    new frame would take the total past ``limit``, the largest backlogs are cut first,
    each by its own policy: one that disconnects is closed (its memory comes back), one
    that drops keeps what it has but takes nothing more while the budget is spent. If the
    one asking is (now) the largest, it is refused, and its own policy applies. ``limit``
    0: no global bound.

    A member provides ``measure()`` (what it really still queues, which may be less than
    it last reported: a consumer drains while paused) and ``cut()`` (apply its policy;
    True when that released its backlog).
    """

    def __init__(self, limit: int, on_release: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.total = 0
        #: member -> the backlog it last reported
        self.members: dict[Any, int] = {}
        #: cuts made to stay within the limit (disconnects and refusals)
        self.cuts = 0
        #: called when a member lets go of a large backlog (the broker trims the heap)
        self.on_release = on_release

    def update(self, member: Any, backlog: int) -> None:
        """``member``'s backlog is now ``backlog`` bytes (0: it drained or left)."""
        members = self.members
        old = members.get(member, 0)
        self.total += backlog - old
        if backlog:
            members[member] = backlog
        else:
            members.pop(member, None)
            if old >= LARGE_RELEASE and self.on_release is not None:
                self.on_release()

    def admits(self, member: Any, backlog: int) -> bool:
        """Whether ``member`` may grow its backlog to ``backlog`` bytes; makes room by
        cutting larger backlogs first. False: ``member`` itself must be cut."""
        limit = self.limit
        current = self.members.get(member, 0)
        if not limit or self.total - current + backlog <= limit:
            return True
        # over the budget (rare): largest first, measured afresh, since a backlog shrinks
        # while its peer reads without us writing to it
        for other, held in sorted(self.members.items(), key=_held, reverse=True):
            if other is member or held < backlog:
                break
            measured = other.measure()
            self.update(other, measured)
            if measured >= backlog and other.cut():
                self.cuts += 1
                self.update(other, 0)
            if self.total - current + backlog <= limit:
                return True
        self.cuts += 1
        return False


def _held(item: tuple[Any, int]) -> int:
    return item[1]


@implementer(IPushProducer)
@define(eq=False)
class Session:
    """One connection, whatever its protocol."""

    protocol: str
    encode: Encoder
    transport: Any
    policy: OutputPolicy
    stats: HubStats
    #: how the hub (or the output budget) closes this connection: ``close(reason)``
    closer: Callable[[str], None]
    host: str = ""
    tls_names: frozenset[str] | None = None
    identity: str | None = None
    #: hub-managed: topic name -> Topic
    subscriptions: dict[str, Topic] = field(factory=dict)
    #: the hub calls this per delivery; ``transport.write`` while the peer keeps up
    send: Callable[[bytes], None] = field(default=None)
    #: bytes held for this peer beyond the transport's high-water mark (while paused)
    backlog: int = 0
    dropped: int = 0
    paused: bool = False
    close_reason: str | None = None
    #: True while the broker has stopped reading from this peer (:meth:`hold_reading`);
    #: keepalive timers count it as activity
    reading_held: bool = False
    #: per-session state for plugins, keyed by plugin name
    data: dict[str, Any] = field(factory=dict)
    #: called once the connection is gone (the service waits on these at shutdown)
    on_lost: list[Callable[[], None]] = field(factory=list)
    #: when set, deliveries are queued and written once per batch (see :class:`Batcher`)
    batcher: Batcher | None = None
    #: the broker's bound on all slow consumers' backlogs together
    budget: OutputBudget | None = None
    #: told of deliveries this session's policy dropped (the broker logs them)
    on_dropped: Callable[[Session, int], None] | None = None
    #: for queue groups (msgbroker.queues): whether the peer has room for another queue
    #: message, and how it takes one; a protocol with acknowledgements sets both
    ready: Callable[[], bool] | None = None
    deliver_queued: Callable[[bytes, Any, Any], None] | None = None
    _fd: Any = field(default=None, init=False, repr=False)
    _reading_holders: set[Any] = field(factory=set, init=False, repr=False)
    _pending: list[bytes] = field(factory=list, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self.send = self._queue if self.batcher is not None else self.transport.write
        self.transport.registerProducer(self, True)
        self._fd = _file_descriptor(self.transport)

    # -- holding the input ------------------------------------------------------------------

    def hold_reading(self, holder: Any) -> None:
        """Stop reading from this peer until ``holder`` (and every other holder) releases
        it: flood control pausing a publisher, a protocol holding requests back while a
        login is answered. Counted, so one holder's release never resumes what another
        still holds; the peer's further bytes wait in its socket buffers, not in ours."""
        holders = self._reading_holders
        if not holders:
            self.reading_held = True
            pause = getattr(_reading_transport(self.transport), "pauseProducing", None)
            if pause is not None and self.close_reason is None:
                pause()
        holders.add(holder)

    def release_reading(self, holder: Any) -> None:
        """``holder`` no longer needs this peer held; reading resumes when nobody does."""
        holders = self._reading_holders
        if holder not in holders:
            return
        holders.discard(holder)
        if not holders:
            self.reading_held = False
            resume = getattr(_reading_transport(self.transport), "resumeProducing", None)
            if resume is not None and self.close_reason is None:
                resume()

    # -- batching: one write per recipient per received chunk, not one per delivery --------

    def _queue(self, frame: bytes) -> None:
        pending = self._pending
        if not pending:
            self.batcher.mark(self)  # type: ignore[union-attr]
        pending.append(frame)

    def flush(self) -> None:
        """Write what was queued, through the output budget (a whole batch is dropped, or
        the peer disconnected, when it does not fit)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        count = len(pending)
        pending.clear()
        if self.close_reason is not None:
            return
        if not self.paused:
            self.transport.write(data)
        elif not self._fits(data):
            self._drop(count)

    # -- IPushProducer: the transport tells us when its buffer is full or drained ----------

    def pauseProducing(self) -> None:
        # Twisted calls this on *every* write while its buffer is over the mark
        if self.close_reason is None and not self.paused:
            self.paused = True
            self._set_backlog(0)
            if self.batcher is None:  # batched output meets the budget at flush
                self.send = self._send_backlogged

    def resumeProducing(self) -> None:
        if self.close_reason is None:
            self.paused = False
            self._set_backlog(0)
            if self.batcher is None:
                self.send = self.transport.write

    def stopProducing(self) -> None:
        self.send = _discard

    # -- slow consumer ---------------------------------------------------------------------

    def measure(self) -> int:
        """Bytes buffered for this peer beyond the transport's high-water mark, measured
        now: a consumer that reads, only slower than a burst, drains while paused and
        must not be mistaken for a stalled one."""
        fd = self._fd
        if fd is None:
            return self.backlog
        buffered: int = fd._tempDataLen + len(fd.dataBuffer) - fd.offset
        mark: int = fd.bufferSize
        return max(0, buffered - mark)

    def _fits(self, frame: bytes) -> bool:
        """Write ``frame`` if the backlog stays within this session's budget and the
        broker's (:class:`OutputBudget`); False if it would not."""
        backlog = self.measure() + len(frame)
        if backlog > self.policy.max_backlog:
            return False
        budget = self.budget
        if budget is not None:
            if not budget.admits(self, backlog):
                return False
            budget.update(self, backlog)
        self.backlog = backlog
        self.transport.write(frame)
        return True

    def _set_backlog(self, backlog: int) -> None:
        self.backlog = backlog
        if self.budget is not None:
            self.budget.update(self, backlog)

    def cut(self) -> bool:
        """The broker's output budget is spent and this is the largest backlog: apply the
        policy. Disconnecting releases the backlog (True); dropping keeps it (False)."""
        if self.policy.drop:
            return False
        self.send = _discard
        self.close("slow consumer")
        return True

    def _drop(self, count: int) -> None:
        self.stats.dropped += count
        self.dropped += count
        if not self.policy.drop:
            self.send = _discard
            self.close("slow consumer")
        elif self.on_dropped is not None:
            self.on_dropped(self, count)

    def _send_backlogged(self, frame: bytes) -> None:
        if not self._fits(frame):
            self._drop(1)

    def reply(self, frame: bytes) -> None:
        """Send a reply to this peer's own request. Within the budget like any output, but
        never dropped: a lost reply would break the request/reply pairing, so a peer that
        does not read its replies is disconnected whatever the policy."""
        if self._pending:  # keep this peer's output in the order it was produced
            self.flush()
        if not self.paused:
            self.transport.write(frame)
        elif self.close_reason is None and not self._fits(frame):
            self.send = _discard
            self.close("slow consumer")

    def close(self, reason: str) -> None:
        """Close the connection for ``reason`` (first reason wins)."""
        if self.close_reason is None:
            self.close_reason = reason
            if reason == "slow consumer":
                # an aborted connection's buffer is freed: it leaves the output budget
                self.left_budget()
            self.closer(reason)

    def left_budget(self) -> None:
        """This session holds no backlog any more (closed)."""
        self._set_backlog(0)

    def kick(self, reason: str) -> None:
        """The hub closes this session: its identity logged in elsewhere."""
        self.send = _discard
        self.close("kicked")

    def __repr__(self) -> str:
        return f"<Session {self.protocol} {self.identity or '-'} {self.host}>"


def _discard(frame: bytes) -> None:
    pass


class Batcher:
    """Coalesces deliveries: a session queues what the hub sends it and is written once
    when the batch is flushed — at the end of the received chunk that caused it (protocols
    call :meth:`flush`), or at the latest on the next reactor turn. A publisher's chunk of
    many messages then costs each recipient one transport write, not one per message."""

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._dirty: list[Session] = []
        self._scheduled = False

    def mark(self, session: Session) -> None:
        self._dirty.append(session)
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        dirty = self._dirty
        while dirty:
            self._dirty = []
            for session in dirty:
                session.flush()
            dirty = self._dirty


def _reading_transport(transport: Any) -> Any:
    """The transport that reads the socket under ``transport``: through TLS, whose protocol
    wrapper cannot pause reading itself."""
    for _ in range(4):
        if transport is None or hasattr(transport, "pauseProducing"):
            break
        transport = getattr(transport, "transport", None)
    return transport


def _file_descriptor(transport: Any) -> Any:
    """The Twisted FileDescriptor under ``transport`` (through TLS wrappers), whose buffer
    size the slow-consumer budget reads; ``None`` for transports without one (tests)."""
    for _ in range(4):
        if all(
            hasattr(transport, a) for a in ("_tempDataLen", "dataBuffer", "offset", "bufferSize")
        ):
            return transport
        transport = getattr(transport, "transport", None)
        if transport is None:
            return None
    return None
