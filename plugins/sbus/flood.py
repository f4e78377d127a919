"""Flood control: what happens to the packets one sbus client cannot take right now.

Every client has an :class:`Outbox`. A delivery is sent straight to the client's socket
while the socket takes it and nothing is waiting; otherwise the client's own choice,
made with control messages (sbus.txt, "Flood control"), decides:

``blocking/soft/...`` — what to do with a packet that cannot be sent without blocking:

- ``queue`` (default): keep it, to send when the socket is writable again;
- ``discard``: drop it (and count it);
- ``block``: keep it, and pause reading from the publisher that sent it until this
  client's backlog is empty — the publisher waits, nobody else does;
- ``error``: the client is misbehaving: it is disconnected.

``blocking/hard/...`` — what to do when a kept packet would take the backlog past the
configured bound (bytes of memory: each packet counts its length plus
:data:`PACKET_OVERHEAD`):

- ``discard``: drop the new packet (the broker's default with ``--slow-consumer drop``);
- ``block``: keep it anyway and pause its publisher, so the backlog overshoots the bound
  by at most one packet per publisher;
- ``error``: disconnect the client (the broker's default, ``--slow-consumer disconnect``).

``order/...`` — in which order a backlog is sent: ``queue`` oldest first (default),
``stack`` newest first, ``random`` largest first: the order that frees memory fastest,
which is what sbus.txt asks of ``random``; equal sizes go oldest first.

Nothing here blocks the bus: a slow client only ever costs its own backlog, its own
packets, or (with ``block``) the reading of the publishers that feed it — and that for
at most ``block_timeout`` seconds per stall (a stall lasts until the backlog is empty
again). Then the client's fallback applies at once: its hard policy, or the broker's when
that is ``block`` (``fallback``): ``error`` disconnects it; ``discard`` lets the paused
publishers go and, for the rest of that stall, drops every packet that would have paused
one. Without a bound (``block_timeout`` None, the clients' side) ``block`` waits for ever.

No Twisted here: the outbox writes through a ``send`` callable with the semantics of
``socket.send`` on a non-blocking socket (``BlockingIOError`` when full), asks for write
readiness through ``want_writable(bool)``, and times a stall with ``call_later(seconds,
f)`` (a server session's ``timers.call_later``: the result has ``cancel()``).

On the server an outbox is the session's output (:class:`msgbroker.output.Output`): the
hub's ``send`` is its :meth:`~Outbox.offer`, and it is a member of the broker's output
budget. There, while its policies can pause nobody (no ``block``), what the hub offers an
idle outbox during one reactor turn is gathered and sent in one system call when the
broker's batcher flushes it, at the end of the turn (``send_many``, ``defer``: the
socket's ``sendmmsg``); what does not fit then meets the policy, in order, as if sent one by one.
With a ``block`` policy each packet is tried at once, so that a publisher is paused at the
very packet that filled the socket. It writes to a
:class:`~.seqpacket.SeqpacketConnection`, or to any byte transport with a streaming
producer through :class:`TransportSink` (the sans-IO test driver's wire).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

from msgbroker.reasons import CloseReason

from .floodpolicy import HARD, ORDER, SOFT, FloodPolicy, Throttle

__all__ = [
    "DRAIN_CHUNK",
    "FEW",
    "HARD",
    "ORDER",
    "PACKET_OVERHEAD",
    "SOFT",
    "FloodPolicy",
    "Outbox",
    "Throttle",
    "TransportSink",
]

#: what keeping a packet costs beyond its bytes (the bytes object's header, its slot in
#: the queue, allocator rounding), so the bound is on memory, not on payload: a backlog of
#: small packets would otherwise take twice its bound
PACKET_OVERHEAD = 48
#: fewer gathered packets than this are sent one ``send`` each: one ``sendmmsg`` through
#: ctypes costs about what two sends do
FEW = 3
#: the most packets of a backlog one ``send_many`` is given
DRAIN_CHUNK = 256


class Outbox:
    """One client's outgoing packets: sent at once when possible, else governed by its
    :class:`FloodPolicy` (see the module docstring).

    ``max_bytes`` bounds the backlog. ``on_error(reason, detail)`` disconnects the client
    (``reason``: :attr:`CloseReason.FLOOD_CONTROL` for its own ``blocking/soft/error``,
    :attr:`CloseReason.SLOW_CONSUMER` for a bound it passed). ``source()`` returns the
    :class:`Throttle` of the publisher whose message is being delivered now, or None.
    ``block_timeout``, ``call_later`` and ``fallback`` bound how long ``block`` may pause
    publishers (all three set, or ``block`` is unbounded); ``on_dropped(count)`` is told of
    every packet dropped; ``budget`` is the broker's bound on all slow consumers together.
    """

    def __init__(
        self,
        send: Callable[[bytes], Any],
        want_writable: Callable[[bool], None],
        on_error: Callable[[CloseReason, str], None],
        max_bytes: int,
        source: Callable[[], Throttle | None] = lambda: None,
        policy: FloodPolicy | None = None,
        *,
        block_timeout: float | None = None,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
        fallback: str = "error",
        on_dropped: Callable[[int], None] | None = None,
        budget: Any = None,
        send_many: Callable[[list[bytes]], int] | None = None,
        defer: Callable[[Outbox], None] | None = None,
    ) -> None:
        self._send = send
        #: sends a list of packets in one call, how many went (BlockingIOError: none fit)
        self._send_many = send_many
        #: has :meth:`flush` called soon (the broker's batcher: at the end of this input)
        self._defer = defer
        #: packets offered since the last flush, while gathering (else None: see
        #: :meth:`policy_changed`)
        self._pending: list[bytes] | None = None
        self._want_writable = want_writable
        self._on_error = on_error
        self._source = source
        self.max_bytes = max_bytes
        self.policy = policy or FloodPolicy()
        #: packets waiting, oldest first (``order/queue`` and ``order/stack``)
        self._waiting: deque[bytes] = deque()
        #: packets waiting as a heap of (-size, arrival, packet) (``order/random``)
        self._heap: list[tuple[int, int, bytes]] | None = None
        self._arrivals = 0
        self.backlog = 0
        self.dropped = 0
        self.closed = False
        self._holding: set[Throttle] = set()
        self.block_timeout = block_timeout
        self.call_later = call_later
        #: the hard policy that replaces ``block`` once a stall outlasts block_timeout
        self.fallback = fallback
        self.on_dropped = on_dropped
        #: the broker's bound on all slow consumers together (an OutputBudget), if any
        self.budget = budget
        #: the pending call that ends this stall's blocking, while publishers are paused
        self._deadline: Any = None
        #: this stall outlasted block_timeout: nothing may pause a publisher until drained
        self._expired = False
        self.reorder()
        self.policy_changed()

    def __len__(self) -> int:
        return len(self._heap) if self._heap is not None else len(self._waiting)

    # -- delivering ------------------------------------------------------------------------

    def offer(self, packet: bytes) -> None:
        """Deliver ``packet``: sent now, or kept, dropped or the client disconnected as its
        policy says. The hub calls this once per delivery."""
        if not self.backlog and not self.closed:
            pending = self._pending
            if pending is not None:  # gathered: one system call at the end of the input
                if not pending:
                    self._defer(self)  # type: ignore[misc]
                pending.append(packet)
                return
            try:
                self._send(packet)
                return
            except BlockingIOError:
                pass
            except OSError:
                self._failed()
                return
        self._cannot_send(packet)

    #: the session's output: what the hub calls per delivery
    send = offer

    def reply(self, packet: bytes) -> None:
        """A packet the client asked for (the answer to ``!/cred/whoami``): never dropped
        by the soft policy, and in order with everything else sent to it."""
        if self.closed:
            return
        if self._pending:
            self.flush()
        if not self.backlog:
            try:
                self._send(packet)
                return
            except BlockingIOError:
                pass
            except OSError:
                self._failed()
                return
        self._keep(packet, hold=False)

    def _cannot_send(self, packet: bytes) -> None:
        if self.closed:
            return
        soft = self.policy.soft
        if soft == "queue":
            self._keep(packet, hold=False)
        elif soft == "discard":
            self._drop()
        elif soft == "block":
            self._keep(packet, hold=True)
        else:
            self._error("could not take a message (blocking/soft/error)", CloseReason.FLOOD_CONTROL)

    def _keep(self, packet: bytes, hold: bool) -> None:
        size = len(packet) + PACKET_OVERHEAD
        budget = self.budget
        if self.backlog + size > self.max_bytes or (
            budget is not None and not budget.admits(self, self.backlog + size)
        ):
            hard = self.policy.hard
            if hard == "discard":
                self._drop()
                return
            if hard == "error":
                self._error("backlog over its bound (blocking/hard/error)")
                return
            hold = True  # hard/block: keep it, and stop its publisher
        if hold:
            if self._expired:  # it may pause nobody until drained: the fallback drops it
                self._drop()
                return
            throttle = self._source()
            if throttle is not None and throttle not in self._holding:
                if not self._holding:
                    self._start_deadline()
                self._holding.add(throttle)
                throttle.hold(self)
        if not self.backlog:
            self._want_writable(True)
        self.backlog += size
        if budget is not None:
            budget.update(self, self.backlog)
        heap = self._heap
        if heap is not None:
            self._arrivals += 1
            heapq.heappush(heap, (-size, self._arrivals, packet))
        else:
            self._waiting.append(packet)

    # -- the socket is writable again -----------------------------------------------------

    def drain(self) -> None:
        """Send what waits until the socket is full or nothing is left; then release the
        publishers this backlog paused, once it is empty."""
        send = self._send
        try:
            if self._heap is not None:
                heap = self._heap
                while heap:
                    send(heap[0][2])
                    self.backlog += heapq.heappop(heap)[0]
            elif self._send_many is not None and self.policy.order == "queue":
                # oldest first, many per system call: a subscriber that keeps falling a
                # socket's worth behind is served from here most of the time
                if not self._drain_many():
                    if self.budget is not None:
                        self.budget.update(self, self.backlog)
                    return
            else:
                waiting = self._waiting
                take = waiting.pop if self.policy.order == "stack" else waiting.popleft
                while waiting:
                    packet = take()
                    try:
                        send(packet)
                    except BaseException:
                        # not sent: back where it came from
                        if take == waiting.pop:
                            waiting.append(packet)
                        else:
                            waiting.appendleft(packet)
                        raise
                    self.backlog -= len(packet) + PACKET_OVERHEAD
        except BlockingIOError:
            if self.budget is not None:
                self.budget.update(self, self.backlog)
            return
        except OSError:
            self._failed()
            return
        if self.budget is not None:
            self.budget.update(self, 0)
        self._want_writable(False)
        self._expired = False  # the stall is over: the next one may block again
        self._release()

    def _drain_many(self) -> bool:
        """:meth:`drain` of ``order/queue`` through ``send_many``: True once empty, False
        when the socket filled up (BlockingIOError when it took nothing)."""
        waiting = self._waiting
        send_many = self._send_many
        while waiting:
            chunk = list(islice(waiting, DRAIN_CHUNK))
            sent = send_many(chunk)  # type: ignore[misc]
            for packet in chunk[:sent]:
                waiting.popleft()
                self.backlog -= len(packet) + PACKET_OVERHEAD
            if sent < len(chunk):
                return False
        return True

    def reorder(self) -> None:
        """The ``order/*`` policy changed: arrange what waits accordingly."""
        if self.policy.order == "random":
            if self._heap is None:
                self._heap = [
                    (-len(p) - PACKET_OVERHEAD, i, p) for i, p in enumerate(self._waiting)
                ]
                heapq.heapify(self._heap)
                self._arrivals = len(self._heap)
                self._waiting.clear()
        elif self._heap is not None:
            self._waiting.extend(p for _, _, p in sorted(self._heap, key=lambda e: e[1]))
            self._heap = None

    # -- bounding block -------------------------------------------------------------------

    def _start_deadline(self) -> None:
        """A stall starts pausing publishers: they wait at most block_timeout."""
        if self.block_timeout is not None and self.call_later is not None:
            self._deadline = self.call_later(self.block_timeout, self._block_expired)

    def _block_expired(self) -> None:
        self._deadline = None
        if self.closed or not self._holding:
            return
        hard = self.policy.hard
        fallback = self.fallback if hard == "block" else hard
        if fallback == "error":
            self._error(f"paused its publishers for {self.block_timeout:g} s (blocking/*/block)")
            return
        # discard: the publishers go on now; until this backlog is empty nothing is held
        self._expired = True
        self._release()

    # -- the broker's output budget (msgbroker.session.OutputBudget) ----------------------

    def measure(self) -> int:
        return self.backlog

    def cut(self) -> bool:
        """All slow consumers together hold too much and this backlog is the largest: the
        client's hard policy (its fallback for block) decides. Disconnecting releases the
        backlog; discarding keeps it, and takes nothing more while the budget is spent."""
        hard = self.policy.hard
        if (self.fallback if hard == "block" else hard) == "error":
            self._error("the broker's output budget is spent (--max-output)")
            return True
        return False

    def _drop(self) -> None:
        self.dropped += 1
        if self.on_dropped is not None:
            self.on_dropped(1)

    # -- ends ------------------------------------------------------------------------------

    def _release(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None:
            deadline.cancel()
        holding, self._holding = self._holding, set()
        for throttle in holding:
            throttle.release(self)

    def _error(self, detail: str, reason: CloseReason = CloseReason.SLOW_CONSUMER) -> None:
        self.close()
        self._on_error(reason, detail)

    def _failed(self) -> None:
        # the client is gone (EPIPE, ECONNRESET): its reader will see the end
        self.close()

    def policy_changed(self) -> None:
        """Call after changing :attr:`policy`: gathering packets for one system call is on
        only with a ``send_many`` and while no policy may pause a publisher (``block``
        must pause it at the very packet that did not fit). Sends what was gathered."""
        self.flush()
        policy = self.policy
        gather = (
            self._send_many is not None
            and self._defer is not None
            and policy.soft != "block"
            and policy.hard != "block"
        )
        self._pending = [] if gather else None

    def flush(self) -> None:
        """Send what was gathered (the Output interface; the batcher calls it at the end of
        the input that offered it): in one call while the socket takes it; what it does
        not take then goes to the policy, in order, as :meth:`offer` would have."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self.closed:
            return
        sent = 0
        try:
            if len(pending) < FEW:
                send = self._send
                for packet in pending:
                    send(packet)
                    sent += 1
            else:
                sent = self._send_many(pending)  # type: ignore[misc]
        except BlockingIOError:
            pass
        except OSError:
            self._failed()
            return
        for packet in pending[sent:] if sent < len(pending) else ():
            self._cannot_send(packet)

    def stop(self) -> None:
        """The connection is being cut (the Output interface): :meth:`close`."""
        self.close()

    def when_drained(self, call: Callable[[], None]) -> None:
        """At once (the Output interface): the seqpacket transport's graceful close sends
        what waits here before it closes."""
        self.flush()
        if not self.closed:
            call()

    def close(self) -> None:
        """Forget every waiting packet and let the publishers this outbox paused go."""
        if self.closed:
            return
        self.closed = True
        if self._pending:
            self._pending = []
        self._waiting.clear()
        self._heap = None
        self.backlog = 0
        if self.budget is not None:
            self.budget.update(self, 0)
        self._want_writable(False)
        self._release()


class TransportSink:
    """An outbox's socket made of a byte transport with a streaming producer, each write one
    packet (the sans-IO test driver's wire): full from the transport's ``pauseProducing``
    until its ``resumeProducing``, which sends what the outbox kept."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.full = False
        self.outbox: Outbox | None = None
        transport.registerProducer(self, True)

    def send_packet(self, packet: bytes) -> None:
        if self.full:
            raise BlockingIOError
        self.transport.write(packet)

    def want_writable(self, want: bool) -> None:
        """Nothing to ask: the transport says when it takes packets again."""

    def write_through(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def pauseProducing(self) -> None:
        self.full = True

    def resumeProducing(self) -> None:
        self.full = False
        if self.outbox is not None and self.outbox.backlog:
            self.outbox.drain()

    def stopProducing(self) -> None:
        if self.outbox is not None:
            self.outbox.close()
