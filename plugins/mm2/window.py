"""Micromessage2's acknowledgement window: the output every Micromessage2 connection writes
its deliveries through (chosen once, by ``MM2ServerSession.make_output``).

The hub sends each connection the same frames, numbered 0 (:func:`.delivery.encode_delivery`);
the window writes its own sequence numbers in and passes them to the framework's
:class:`~msgbroker.output.TransportOutput` it wraps, so batching, the transport's
slow-consumer hold and the broker's output budget apply as for any protocol. With ``ack``
(a window of 1) or ``batch-ack`` (``max-count``) active, at most that many messages are
unacknowledged; the rest are *held here*, counted as the memory they take (their frames
plus :data:`HELD_OVERHEAD` each), within ``--max-backlog`` and the broker's output budget,
of which the window is a member (``measure``/``cut``). Past them the ``--slow-consumer``
policy applies: ``drop`` discards the newest held messages, ``disconnect`` cuts the
connection off (nothing more is sent to it, not even on an ack) and closes it on the next
turn, once the fan-out that outgrew the bound is over.

Queue groups (:mod:`msgbroker.queues`) ask :meth:`WindowOutput.ready` before handing a
member a message and hand it through :meth:`WindowOutput.deliver_queued`, which keeps
``(message, group)`` until it is acknowledged (a group that tracks acknowledgements, one
across the nodes of a cluster, is then told); :meth:`WindowOutput.abandon` gives back
those never acknowledged when the connection is gone. :meth:`WindowOutput.room` says how
many such a group may hand it now (a cluster's group reads that many from its store).

The window's size and the ``dotnet`` extension's id come from the handshake: the output is
made when the connection opens and configured after it (:meth:`WindowOutput.configure`).
"""

from __future__ import annotations

import struct
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any

from msgbroker.errors import RemoteProtocolError
from msgbroker.reasons import CloseReason

from . import codec
from .delivery import extension_frame, messages, numbered, type_marker
from .frames import CONTINUED, EXTENSION, LARGE

if TYPE_CHECKING:
    from msgbroker.message import Message
    from msgbroker.output import Output, OutputBudget, OutputPolicy
    from msgbroker.queues import QueueGroup
    from msgbroker.session import Session
    from msgbroker.timers import Timer, Timers

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
#: a MESSAGE frame's flags and sequence number
_PLAIN_HEAD = struct.Struct(">BH")
#: the last frame a window-less connection was sent, and what follows its sequence number
#: when it is one plain MESSAGE frame (else None); module-level on purpose: a pure function
#: of the frame, which is the same object for every recipient of a message (the reference
#: held keeps its identity from being reused)
_last_plain: list[bytes | None] = [None, None]

#: what holding a message for a full ack window costs beyond its frames (the bytes
#: object, the tuple, the deque slot): counted so that a flood of tiny messages is bounded
#: by the memory it takes, not by its frame bytes alone
HELD_OVERHEAD = 100

#: a queue message sent and not yet acknowledged, or None for any other message
Queued = tuple["Message", "QueueGroup"] | None



class _NoDeque(tuple):
    """What ``unacked`` and ``held`` are until they are needed: empty, read like a deque,
    and appending to it fails loudly (it has no ``append``)."""

    __slots__ = ()

    def clear(self) -> None:
        pass


_NOTHING: Any = _NoDeque()


class WindowOutput:
    """One Micromessage2 connection's output (see the module docstring): the
    :class:`msgbroker.output.Output` interface, plus ``ready`` and ``deliver_queued`` for
    queue groups, over the framework output ``out``."""

    __slots__ = (
        "_close_timer",
        "_reported",
        "_timers",
        "_type",
        "budget",
        "cut_off",
        "dotnet_id",
        "held",
        "held_bytes",
        "out",
        "policy",
        "queued",
        "seq_out",
        "session",
        "size",
        "stopped",
        "unacked",
        "wrapped",
    )

    def __init__(
        self, session: Session, out: Output, policy: OutputPolicy, budget: OutputBudget | None
    ) -> None:
        self.session = session
        #: the framework output written through (batched, within the transport's budget)
        self.out = out
        self.policy = policy
        self.budget = budget
        #: at most this many messages unacknowledged (None: no ack extension, no window)
        self.size: int | None = None
        #: the dotnet extension's id on this connection (None: not active)
        self.dotnet_id: int | None = None
        #: the last sequence number sent (0: none yet), and whether the numbers went round
        #: (then every number was sent once)
        self.seq_out = 0
        self.wrapped = False
        #: sent, not yet acknowledged: (seq, queue message and group, or None), oldest first;
        #: only with a window (:meth:`configure`), and held messages only once some are
        #: (:meth:`_hold`): until then both are the one shared, empty deque (an empty deque
        #: is 760 bytes per connection)
        self.unacked: deque[tuple[int, Queued]] = _NOTHING
        #: how many of ``unacked`` are queue messages (0: an ack looks at none of them)
        self.queued = 0
        #: messages waiting for the window to open, and what they take
        self.held: deque[tuple[bytes, Queued]] = _NOTHING
        self.held_bytes = 0
        #: past the bound (``disconnect``): nothing more is sent; the close is on its way
        self.cut_off = False
        #: nothing more is written (the connection is being closed, or gone)
        self.stopped = False
        self._type: str | None = None  # the last dotnet type sent
        self._reported = 0  # the held bytes the budget knows of
        self._timers: Timers | None = None
        self._close_timer: Timer | None = None

    def configure(self, timers: Timers, size: int | None, dotnet_id: int | None) -> None:
        """What the handshake activated: a window of ``size`` messages (None: no ack
        extension) and the dotnet extension's id; ``timers`` are the session's."""
        self._timers = timers
        self.size = size
        self.dotnet_id = dotnet_id
        if size is not None and self.unacked is _NOTHING:
            self.unacked = deque()

    # -- Output --------------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        """What the hub sends (one or several messages' frames, numbered 0): numbered and
        written while the window has room, held otherwise."""
        if not self.held and not self.cut_off:
            size = self.size
            if size is None and not frame[0]:
                # The common delivery, once per recipient of every message: no window, one
                # frame with flags 0 (no type marker, not a fragment, not LARGE). Numbered
                # here rather than in _number_all: a call less per delivery. The hub hands
                # every recipient the same frame object: what follows its number is cut
                # once, for the first of them (_last_plain).
                last = _last_plain
                if last[0] is frame:
                    tail = last[1]
                else:
                    at = 4 + frame[3]
                    at += 2 + (frame[at] << 8 | frame[at + 1])
                    tail = frame[3:] if at + 1 + frame[at] == len(frame) else None
                    last[0], last[1] = frame, tail
                if tail is not None:
                    seq = self.seq_out
                    self.seq_out = seq = 1 if seq == 0xFFFF else seq + 1
                    if seq == 0xFFFF:
                        self.wrapped = True
                    self.out.send(_PLAIN_HEAD.pack(0, seq) + tail)
                    return
            data = self._number_all(frame, None if size is None else size - len(self.unacked))
            if data is not None:
                self.out.send(data)
                return
        self._hold(messages(frame), None)

    def reply(self, frame: bytes) -> None:
        self.out.reply(frame)

    def flush(self) -> None:
        self.out.flush()

    def stop(self) -> None:
        """Nothing more is written. Queue messages taken stay (:meth:`abandon` gives them
        back once the connection is gone); what else was held is let go."""
        self.stopped = True
        self._cancel_close()
        self.out.stop()
        self._let_go()

    def when_drained(self, call) -> None:
        """What the transport output holds is written; what the ack window holds is not:
        it would wait for acknowledgements, and a stopping broker reads no more input."""
        self.out.when_drained(call)

    def measure(self) -> int:
        return self.held_bytes

    def cut(self) -> bool:
        """The broker's output budget is spent and this window holds the largest backlog:
        ``drop`` keeps what it holds (and holds no more while the budget stays spent);
        ``disconnect`` cuts the connection off."""
        if self.policy.drop:
            return False
        self._cut_off()
        return True

    # -- queue groups ------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the window has room for a queue message now (a connection cut off or
        closing takes none: another member should)."""
        size = self.size
        return (
            not self.held
            and (size is None or len(self.unacked) < size)
            and not self.cut_off
            and not self.stopped
        )

    def room(self) -> int | None:
        """How many queue messages the window takes now (None: as many as come)."""
        if self.held or self.cut_off or self.stopped:
            return 0
        size = self.size
        return None if size is None else max(0, size - len(self.unacked))

    def deliver_queued(self, frame: bytes, message: Message, group: QueueGroup) -> bool:
        """Send a queue message; True when it is kept until acknowledged."""
        if self.size is None:  # no acks: nothing to give back, ever
            self.send(frame)
            return False
        self._hold([frame], (message, group))
        return True

    def abandon(self) -> list[tuple[Message, QueueGroup]]:
        """The connection is gone: the queue messages it took and never acknowledged,
        oldest first (for :meth:`msgbroker.hub.Hub.redeliver`). Nothing is kept."""
        self.stopped = True
        self._cancel_close()
        taken = [q for _seq, q in self.unacked if q is not None]
        taken += [q for _piece, q in self.held if q is not None]
        self.queued = 0
        self.unacked.clear()
        self.held.clear()
        self.held_bytes = 0
        self._report()
        return taken

    # -- acknowledgements ----------------------------------------------------------------------

    def acknowledge(self, seq: int) -> int:
        """The client acknowledged every message up to ``seq``: held messages go out as
        the window opens. Returns how many it acknowledged (0: a stale ack); an ack for a
        number never sent is the client's error."""
        if self.seq_out == 0 or (not self.wrapped and seq > self.seq_out):
            raise RemoteProtocolError(f"ack of message {seq}, which was never sent")
        unacked = self.unacked
        if not unacked:
            return 0
        count = codec.acked_count(unacked[0][0], len(unacked), seq)
        if self.queued:
            self._acknowledge_queued(count)
        else:
            for _ in range(count):
                unacked.popleft()
        if count:
            self.release()
        return count

    def _acknowledge_queued(self, count: int) -> None:
        """The oldest ``count`` acknowledged, queue messages among them: their groups that
        track acknowledgements are told."""
        unacked = self.unacked
        for _ in range(count):
            queued = unacked.popleft()[1]
            if queued is not None:
                self.queued -= 1
                message, group = queued
                if group.tracks_acks:
                    group.acked(message)

    def release(self) -> None:
        """Send held messages while the window has room: consecutive plain ones (not from
        a queue group) joined and numbered in one pass, the others one by one. Nothing once
        cut off: those were counted as dropped."""
        if self.held and not self.cut_off and not self.stopped:
            self._send_held()
            self._report()

    def _send_held(self) -> None:
        held, size, unacked = self.held, self.size, self.unacked
        while held and (size is None or len(unacked) < size):
            room = None if size is None else size - len(unacked)
            take: list[bytes] = []
            while held and held[0][1] is None and (room is None or len(take) < room):
                take.append(held.popleft()[0])
            if not take:
                piece, queued = held.popleft()
                self.held_bytes -= len(piece) + HELD_OVERHEAD
                self._send_numbered(piece, queued)
                continue
            self.held_bytes -= sum(map(len, take)) + HELD_OVERHEAD * len(take)
            data = self._number_all(b"".join(take), room)
            if data is not None:
                self.out.send(data)
            else:  # a dotnet marker among them
                for piece in take:
                    self._send_numbered(piece, None)

    # -- numbering -----------------------------------------------------------------------------

    def _number_all(self, data: bytes, room: int | None) -> bytes | None:
        """``data`` with every MESSAGE numbered in one pass, when all of it fits in the
        window's ``room`` (None: no window); None (nothing done) when it does not, or when
        it holds a dotnet marker: then message by message."""
        flags = data[0]
        if not flags & (EXTENSION | CONTINUED):
            # One whole MESSAGE frame (a per-message delivery, the common case when
            # messages arrive to mixed topics): its number is spliced in, no copy to edit.
            at = 4 + data[3]
            at += 2 + (data[at] << 8 | data[at + 1])
            end = at + 4 + _U32.unpack_from(data, at)[0] if flags & LARGE else at + 1 + data[at]
            if end == len(data):
                if room is not None and room < 1:
                    return None
                seq = self.seq_out
                seq = 1 if seq == 0xFFFF else seq + 1
                if room is not None:
                    self.unacked.append((seq, None))
                if seq == 0xFFFF:
                    self.wrapped = True
                self.seq_out = seq
                return data[:1] + _U16.pack(seq) + data[3:]
        out = bytearray(data)
        pos, size = 0, len(out)
        seq = self.seq_out
        current = 1 if seq == 0xFFFF else seq + 1
        numbers = []
        while pos < size:
            flags = out[pos]
            if flags & EXTENSION:
                return None
            out[pos + 1] = current >> 8
            out[pos + 2] = current & 0xFF
            at = pos + 4 + out[pos + 3]
            at += 2 + (out[at] << 8 | out[at + 1])
            if flags & LARGE:
                pos = at + 4 + int.from_bytes(out[at : at + 4], "big")
            else:
                pos = at + 1 + out[at]
            if not flags & CONTINUED:
                seq = current
                numbers.append(seq)
                current = 1 if seq == 0xFFFF else seq + 1
        if room is not None:
            if len(numbers) > room:
                return None
            self.unacked.extend(zip(numbers, repeat(None)))
        if 0xFFFF in numbers:
            self.wrapped = True
        self.seq_out = seq
        return bytes(out)

    def _send_numbered(self, piece: bytes, queued: Queued) -> None:
        """One message's frames numbered and written, after its own dotnet type frame when
        its type differs from the last one sent."""
        type_name, piece = type_marker(piece)
        if type_name is not None and self.dotnet_id is not None and type_name != self._type:
            self._type = type_name
            self.out.send(extension_frame(self.dotnet_id, type_name.encode("utf-8")))
        self.seq_out = seq = codec.next_seq(self.seq_out)
        if seq == codec.SEQ_CYCLE:
            self.wrapped = True
        if self.size is not None:
            self.unacked.append((seq, queued))
            if queued is not None:
                self.queued += 1
        self.out.send(numbered(piece, seq))

    # -- holding -------------------------------------------------------------------------------

    def _hold(self, pieces: list[bytes], queued: Queued) -> None:
        """Messages the window has no room for (or that must be numbered one by one):
        held, sent as far as the window allows, and the bounds applied to the rest."""
        if self.stopped:
            return
        if self.cut_off:
            self._dropped(len(pieces))
            return
        held = self.held
        if held is _NOTHING:
            held = self.held = deque()
        for piece in pieces:
            held.append((piece, queued))
            self.held_bytes += len(piece) + HELD_OVERHEAD
        self._send_held()
        policy = self.policy
        dropped = 0
        if self.held_bytes > policy.max_backlog:  # this connection's own bound
            if not policy.drop:
                self._cut_off()
                return
            dropped = self._drop_newest(policy.max_backlog)
        if not self._admitted():  # the broker's output budget, for all connections together
            if not policy.drop:
                self._cut_off()
                return
            dropped += self._drop_newest(self._reported)
        self._report()
        self._dropped(dropped)

    def _admitted(self) -> bool:
        """Whether the budget lets the window hold what it holds now. It knows of what was
        held before (``_reported``): only growth is asked about, so a window that keeps up
        costs the budget nothing."""
        budget, backlog = self.budget, self.held_bytes
        return budget is None or backlog <= self._reported or budget.admits(self, backlog)

    def _drop_newest(self, bound: int) -> int:
        """``--slow-consumer drop``: discard the newest held messages (not queue ones) until
        what is held fits ``bound``; returns how many."""
        held, count = self.held, 0
        while self.held_bytes > bound and held and held[-1][1] is None:
            self.held_bytes -= len(held.pop()[0]) + HELD_OVERHEAD
            count += 1
        return count

    def _cut_off(self) -> None:
        """Past a bound under ``disconnect``: what is held is counted dropped and let go,
        nothing more is sent, and the connection closes on the next turn — not now: the
        hub may be iterating over the recipients this close removes."""
        if self.cut_off:
            return
        self.cut_off = True
        self._dropped(sum(1 for _piece, q in self.held if q is None))
        self._let_go()
        timers = self._timers
        if timers is None:  # not configured: nothing was held, so no fan-out is under way
            self.session.close(CloseReason.SLOW_CONSUMER)
        else:
            self._close_timer = timers.call_later(0, self._close_slow_consumer)

    def _close_slow_consumer(self) -> None:
        self._close_timer = None
        self.session.close(CloseReason.SLOW_CONSUMER)

    def _cancel_close(self) -> None:
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None

    def _let_go(self) -> None:
        """Forget held messages other than queue ones: those go back to their group when the
        connection is gone (:meth:`abandon`)."""
        if any(q is not None for _piece, q in self.held):
            self.held = deque(item for item in self.held if item[1] is not None)
        else:
            self.held.clear()
        self.held_bytes = 0
        self._report()

    def _report(self) -> None:
        """Tell the broker's output budget what the window holds (when it changed)."""
        budget, backlog = self.budget, self.held_bytes
        if budget is not None and backlog != self._reported:
            budget.update(self, backlog)
            self._reported = backlog

    def _dropped(self, count: int) -> None:
        """``count`` deliveries discarded by the slow-consumer policy: counted as the
        framework output counts its own (hub stats, the session, the broker's log)."""
        if not count:
            return
        session = self.session
        session.stats.dropped += count
        session.dropped += count
        if session.on_dropped is not None:
            session.on_dropped(session, count)
