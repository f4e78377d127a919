"""How a session's output reaches its peer: one :class:`Output`, chosen when the session opens.

The hub calls ``session.send(frame)`` per delivery; that is the ``send`` of the session's
output, bound once when the session opens and never swapped. A protocol answers its peer's
own requests through ``output.reply(frame)``. Three kinds exist, behind the same interface:

- :class:`TransportOutput` (every stream protocol: TCP, TLS, WebSocket): deliveries are
  batched — one transport write per recipient per received chunk (:class:`Batcher`) — and
  a peer that stops reading meets its byte budget and the broker's (:class:`OutputBudget`);
- MM2's acknowledgement window (``msgbroker.plugins.mm2.window``), which numbers what it
  sends and holds what the window has no room for;
- sbus's flood-control outbox (``msgbroker.plugins.sbus.flood``), whose policies a client
  chooses itself.

An output that holds a backlog is a member of the broker's :class:`OutputBudget`: it reports
its backlog (``budget.update``) and provides ``measure()`` and ``cut()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from attrs import frozen
from twisted.internet import tcp
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from .reasons import CloseReason

if TYPE_CHECKING:
    from .session import Session


class Output(Protocol):
    """What a session's output provides, whatever writes it."""

    def send(self, frame: bytes) -> None:
        """A delivery: written (perhaps batched), or dropped or the peer disconnected when
        it does not read (the session's policy)."""

    def reply(self, frame: bytes) -> None:
        """An answer to the peer's own request, after everything sent before it. Never
        dropped: a peer that does not read its answers is disconnected."""

    def flush(self) -> None:
        """Write what is batched now."""

    def measure(self) -> int:
        """The backlog this output holds for its peer now, in bytes (budget member)."""

    def cut(self) -> bool:
        """The broker's output budget is spent and this is the largest backlog: apply the
        policy. True when that released the backlog (the peer is disconnected)."""

    def stop(self) -> None:
        """Nothing more is written (the connection is being cut)."""

    def when_drained(self, call: Callable[[], None]) -> None:
        """Call ``call`` once what this output holds has been handed to the transport (at
        once when it holds nothing); never once it is stopped. At shutdown the broker
        closes each connection gracefully then (the transport flushes the rest)."""


@frozen
class OutputPolicy:
    """What a session does with output its peer does not read.

    ``max_backlog``: bytes the broker holds for a peer beyond the transport's high-water mark
    (Twisted's 64 KiB ``bufferSize``); the kernel's socket buffers come on top. ``drop``:
    past the budget, discard (and count) instead of disconnecting.
    """

    max_backlog: int = 16 << 20
    drop: bool = False


#: a backlog at least this large, let go at once, is worth handing back to the system
LARGE_RELEASE = 1 << 20


class OutputBudget:
    """The bytes queued for *all* slow consumers together (``max-output``).

    A per-connection bound alone lets many slow readers take all memory (100 of them at
    16 MiB each is 1.6 GB). Members are the outputs currently holding a backlog; each
    reports its backlog as it changes (:meth:`update`). When a new frame would take the
    total past ``limit``, the largest backlogs are cut first, each by its own policy: one
    that disconnects is closed (its memory comes back), one that drops keeps what it has but
    takes nothing more while the budget is spent. If the one asking is (now) the largest, it
    is refused, and its own policy applies. ``limit`` 0: no global bound.
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
        # over the budget (rare): largest first, measured afresh, since a backlog may shrink
        # while its peer reads
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


class Batcher:
    """Coalesces output: an output queues what the hub sends it (and the replies to its
    peer) and is written once when the batch is flushed — at the end of the reactor turn
    (``callLater(0)`` runs after every input the poll reported has been read), or earlier
    where the order of events needs it (:meth:`flush`). The chunks of many messages that
    publishers sent in one turn then cost each recipient one write, not one per message
    nor one per chunk; with :func:`write_through`, a system call and no ``epoll_ctl``."""

    def __init__(self, clock: Any) -> None:
        self._clock = clock
        self._dirty: list[Any] = []
        self._scheduled = False
        #: the reactor's end-of-poll call when it has one (msgbroker.reactor), else None:
        #: then a callLater(0), which Twisted runs after the poll's events too
        self._after_poll: Callable[[Callable[[], None]], None] | None = getattr(
            clock, "call_after_poll", None
        )
        #: the callLater(0) waiting for the end of the turn, if any
        self._call: Any = None

    def mark(self, output: Any) -> None:
        self._dirty.append(output)
        if not self._scheduled:
            self._scheduled = True
            after_poll = self._after_poll
            if after_poll is not None:
                after_poll(self._turn)
            else:
                self._call = self._clock.callLater(0, self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self._call = None
        self.flush()

    def flush(self) -> None:
        dirty = self._dirty
        while dirty:
            self._dirty = []
            for output in dirty:
                output.flush()
            dirty = self._dirty
        call = self._call
        if call is not None:  # written early (a close, a test): the turn has nothing left
            self._call = None
            self._scheduled = False
            call.cancel()


@implementer(IPushProducer)
class TransportOutput:
    """Batched output to a Twisted transport, within the session's byte budget.

    While the peer keeps up, a batch is one ``transport.write``. The output is the
    transport's streaming producer: when the transport's buffer passes its high-water mark
    Twisted calls :meth:`pauseProducing`, and from then on what would be written is *held
    here*, counted, within ``policy.max_backlog`` and the broker's budget; past them the
    policy applies — ``drop`` (count and discard) or ``disconnect``. When the transport has
    written everything (:meth:`resumeProducing`), what was held goes to it until it is full
    again. Nobody else waits: the publisher and the other recipients never see the slow one.
    """

    __slots__ = (
        "__weakref__",
        "_drained",
        "_held",
        "_pending",
        "_replies",
        "_write",
        "batcher",
        "budget",
        "held_bytes",
        "paused",
        "policy",
        "session",
        "stopped",
        "transport",
    )

    def __init__(
        self,
        session: Session,
        transport: Any,
        policy: OutputPolicy,
        batcher: Batcher,
        budget: OutputBudget | None = None,
    ) -> None:
        self.session = session
        self.transport = transport
        self.policy = policy
        self.batcher = batcher
        self.budget = budget
        self._pending: list[bytes] = []
        #: where in ``_pending`` the replies are (None: no reply in this batch)
        self._replies: list[int] | None = None
        self._write = write_through if _writes_through(transport) else _write
        #: made at the first hold: an empty deque is 760 bytes, and most peers keep up
        self._held: deque[bytes] | None = None
        #: bytes held here because the transport's buffer is full
        self.held_bytes = 0
        self.paused = False
        self.stopped = False
        #: called once the held backlog is written (:meth:`when_drained`)
        self._drained: Callable[[], None] | None = None
        transport.registerProducer(self, True)

    def send(self, frame: bytes) -> None:
        pending = self._pending
        if not pending:
            self.batcher.mark(self)
        pending.append(frame)

    def reply(self, frame: bytes) -> None:
        # batched with the deliveries, in the order they were produced: a publisher's chunk
        # of requests is answered with one write, not one per request
        pending = self._pending
        if not pending:
            self.batcher.mark(self)
        replies = self._replies
        if replies is None:
            replies = self._replies = []
        replies.append(len(pending))
        pending.append(frame)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        replies = self._replies
        if self.stopped:
            pending.clear()
            self._replies = None
            return
        if self.paused:  # the peer does not read: hold within the budgets (rare)
            self._flush_paused()
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        count = len(pending)
        pending.clear()
        if replies is not None:
            count -= len(replies)
            self._replies = None
        self._write(self.transport, data)
        # counted per batch, not per frame
        session = self.session
        session.bytes_out += len(data)
        session.frames_out += count

    def _flush_paused(self) -> None:
        """The batch while the transport is full: deliveries are held or, past the budget,
        dropped (or the peer disconnected: its policy); a reply is held or the peer is
        disconnected, never dropped."""
        pending = self._pending
        replies = self._replies or ()
        batch = pending[:]
        pending.clear()
        self._replies = None
        session = self.session
        start = 0
        for at in [*replies, len(batch)]:
            if at > start:  # deliveries batch[start:at]
                data = b"".join(batch[start:at])
                if not self._hold(data):
                    self._drop(at - start)
                    if self.stopped:
                        return
                else:
                    session.bytes_out += len(data)
                    session.frames_out += at - start
            if at == len(batch):
                return
            frame = batch[at]
            if not self._hold(frame):
                self.stopped = True
                session.close(CloseReason.SLOW_CONSUMER)
                return
            session.bytes_out += len(frame)
            start = at + 1

    def stop(self) -> None:
        self.stopped = True
        self._drained = None
        self._pending.clear()
        self._replies = None
        self._release()

    def when_drained(self, call: Callable[[], None]) -> None:
        if self.stopped:
            return
        self.flush()
        if self._held:
            self._drained = call  # resumeProducing writes the rest, then calls it
        else:
            call()

    # -- IPushProducer: the transport says when its buffer is full or empty -----------------

    def pauseProducing(self) -> None:
        self.paused = True  # Twisted calls this on every write while over the mark

    def resumeProducing(self) -> None:
        if self.stopped:
            return
        self.paused = False
        held = self._held
        if not held:
            return
        write = self.transport.write
        while held and not self.paused:  # a write past the mark pauses us again
            data = held.popleft()
            self.held_bytes -= len(data)
            write(data)
        if not held:
            self._held = None  # let the deque go: the peer caught up
        self._report()
        if not held and self._drained is not None:
            drained, self._drained = self._drained, None
            drained()

    def stopProducing(self) -> None:
        self.stop()

    # -- the slow consumer -------------------------------------------------------------------

    def measure(self) -> int:
        return self.held_bytes

    def cut(self) -> bool:
        if self.policy.drop:
            return False
        self.stopped = True
        self.session.close(CloseReason.SLOW_CONSUMER)
        return True

    def _hold(self, data: bytes) -> bool:
        """Hold ``data`` if the backlog stays within this session's budget and the
        broker's; False if it would not."""
        backlog = self.held_bytes + len(data)
        if backlog > self.policy.max_backlog:
            return False
        budget = self.budget
        if budget is not None:
            if not budget.admits(self, backlog):
                return False
            budget.update(self, backlog)
        held = self._held
        if held is None:
            held = self._held = deque()
        held.append(data)
        self.held_bytes = backlog
        return True

    def _drop(self, count: int) -> None:
        session = self.session
        session.stats.dropped += count
        session.dropped += count
        if not self.policy.drop:
            self.stopped = True
            session.close(CloseReason.SLOW_CONSUMER)
        elif session.on_dropped is not None:
            session.on_dropped(session, count)

    def _release(self) -> None:
        self._held = None
        self.held_bytes = 0
        self._report()

    def _report(self) -> None:
        if self.budget is not None:
            self.budget.update(self, self.held_bytes)


def _write(transport: Any, data: bytes) -> None:
    transport.write(data)


def _writes_through(transport: Any) -> bool:
    """Whether ``transport`` is a TCP or unix stream connection of Twisted's own (its TLS
    is known only later, so :func:`write_through` checks it on every write)."""
    return isinstance(transport, tcp.Connection)


def write_through(transport: Any, data: bytes) -> None:
    """Write ``data`` to a Twisted TCP transport, sending it now when nothing is queued.

    Twisted's ``write`` only queues: it asks epoll to watch the socket for writability
    (``epoll_ctl``), and the next reactor turn sends and stops watching (``epoll_ctl``
    again), one more poll and dispatch per write. The batcher already writes once per
    recipient per reactor turn, at its end, so there is nothing left to coalesce: send at
    once, and hand Twisted only what the socket did not take (it then paces the rest, and
    pauses this output past its high-water mark, as before). Through TLS, while Twisted
    still holds bytes, or once the connection is closing, Twisted's write does it all.
    """
    if (
        transport.dataBuffer
        or transport._tempDataLen
        or transport.TLS
        or transport.disconnecting
        or transport._writeDisconnecting
        or not transport.connected
    ):
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except OSError:  # EAGAIN, or a failing connection: Twisted's write finds out and reports
        sent = 0
    if sent < len(data):
        transport.write(data[sent:] if sent else data)
