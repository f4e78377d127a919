"""Queue groups: subscribers of a topic that name the same group share its messages; each
message goes to exactly one member of each group (Micromessage2's ``queue`` argument,
DECISIONS.md), while plain subscribers each get every message.

Which member: the next one, round-robin, whose filters match and that has room. A peer
says whether it has room with an optional ``ready()`` method (a Micromessage2 consumer
whose ack window is full has none); a peer without that method always has room. When
members match but none has room, the message waits in the group's backlog, in order,
until a member has room again (its protocol calls :meth:`Hub.ready`) — so a consumer that
never acks holds at most its window, and the others take the rest. When no member matches,
the group does not take the message.

A peer may receive from a queue through an optional ``deliver_queued(frame, message,
group)`` method instead of ``send(frame)``: a protocol with acknowledgements keeps
``(message, group)`` until the message is acknowledged (and returns True), and when the
connection closes with messages unacknowledged it gives them back with
``group.redeliver(message)``, which offers each to the remaining members (or keeps it in
the backlog). A group whose ``tracks_acks`` is set (a queue group across the nodes of a
cluster, :mod:`msgbroker.clusterqueues`) is told of each acknowledgement
(:meth:`QueueGroup.acked`), and of a message taken by a member that never acknowledges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from attrs import define, field

from .filters import Filter, matches_all
from .message import Message

#: bytes of messages a group holds while none of its members has room (``mm2-queue-backlog``);
#: past it the oldest are dropped (and counted)
DEFAULT_QUEUE_BACKLOG = 16 << 20
#: what holding a message costs beyond its payload and frames (the Message object, its slot)
MESSAGE_OVERHEAD = 200


def held_cost(message: Message) -> int:
    """What keeping ``message`` costs: its payload, the frames already encoded for it (the
    members' protocol encodes it before it is kept, and the memo keeps that frame as long
    as the message lives: for a Micromessage2 member as large as the payload again), and
    :data:`MESSAGE_OVERHEAD`."""
    payload = message.payload
    # a frame that is the payload object itself (an encoder passing it through) costs nothing
    frames = sum(len(f) for f in message._memo.values() if type(f) is bytes and f is not payload)
    return len(payload) + frames + MESSAGE_OVERHEAD


@define(eq=False)
class QueueGroup:
    """One queue group of one topic."""

    topic: str
    name: str
    #: member -> its filters, in the order they joined
    members: dict[Any, tuple[Filter, ...]] = field(factory=dict)
    #: messages waiting for a member with room
    backlog: deque[Message] = field(factory=deque)
    #: bound on ``backlog_bytes``
    limit: int = DEFAULT_QUEUE_BACKLOG
    #: what ``backlog`` holds: each message's :func:`held_cost` when it was kept
    backlog_bytes: int = 0
    #: called with the number of messages dropped from a full (or abandoned) backlog
    on_drop: Callable[[int], None] | None = None
    #: called with (member, message) for each message a member takes
    on_deliver: Callable[[Any, Message], None] | None = None
    _turn: int = 0  # where the round-robin resumes
    #: whether members tell the group of acknowledgements (:meth:`acked`); a class's choice
    tracks_acks = False
    #: ``held_cost`` of each message of ``backlog``, in step with it: a message's memo may
    #: grow while it waits, and what is taken off must be what was added
    _costs: deque[int] = field(factory=deque)

    def add(self, peer: Any, filters: tuple[Filter, ...] = ()) -> int:
        """A new member; it may take waiting messages at once (returns how many)."""
        self.members[peer] = filters
        return self.drain()

    def remove(self, peer: Any) -> None:
        del self.members[peer]
        if not self.members and self.backlog:
            left = list(self.backlog)
            self.backlog.clear()
            self._costs.clear()
            self.backlog_bytes = 0
            self._let_go(left, unmatched=False)  # nobody is left to take them

    def acked(self, message: Message) -> None:
        """A member acknowledged ``message`` (only with :attr:`tracks_acks`)."""

    def offer(self, message: Message, sender: Any = None) -> int:
        """Deliver ``message`` to one member (1), keep it for later (0), or decline it
        because no member's filters match (0). Messages already waiting go first."""
        delivered = 0
        if self.backlog:
            delivered = self.drain()
            if self.backlog:
                if self._matching(message, sender):
                    self._keep(message)
                return delivered
        return delivered + self._deliver(message, sender)

    def redeliver(self, message: Message) -> int:
        """A message a member received but never acknowledged (it went away): offer it to
        the others, ahead of the backlog's newer messages."""
        if not self._matching(message, None):
            self._let_go([message], unmatched=True)  # nobody left who would take it
            return 0
        return self._deliver(message, None, keep_first=True)

    def redeliver_all(self, messages: Iterable[Message]) -> int:
        """Several messages a member received but never acknowledged, oldest first: offered
        to the others in that order; once one has to wait, the rest wait behind it, all
        ahead of the backlog's newer messages (one :meth:`redeliver` each would reverse
        them). They may take the backlog past its bound until the next message is kept."""
        delivered = 0
        waiting: list[Message] = []
        for message in messages:
            if not self._matching(message, None):
                self._let_go([message], unmatched=True)
                continue
            if not waiting:
                peer = self._pick(message, None)
                if peer is not None:
                    _deliver_to(peer, message, self)
                    delivered += 1
                    continue
            waiting.append(message)
        for message in reversed(waiting):
            self._keep(message, first=True)
        return delivered

    def drain(self) -> int:
        """Deliver waiting messages while some member has room; returns how many went."""
        delivered = 0
        backlog = self.backlog
        while backlog:
            message = backlog[0]
            peer = self._pick(message, None)
            if peer is None:
                if not self._matching(message, None):  # its matching member left
                    self._let_go([self._take_first()], unmatched=True)
                    continue
                break
            self._take_first()
            _deliver_to(peer, message, self)
            delivered += 1
        return delivered

    # -- inside ------------------------------------------------------------------------------

    def _deliver(self, message: Message, sender: Any, keep_first: bool = False) -> int:
        peer = self._pick(message, sender)
        if peer is None:
            if self._matching(message, sender):
                self._keep(message, first=keep_first)
            return 0
        _deliver_to(peer, message, self)
        return 1

    def _pick(self, message: Message, sender: Any) -> Any:
        """The next member, round-robin, whose filters match and that has room."""
        members = list(self.members.items())
        count = len(members)
        for step in range(count):
            index = (self._turn + step) % count
            peer, filters = members[index]
            if not _takes(peer, filters, message, sender):
                continue
            ready = getattr(peer, "ready", None)
            if ready is not None and not ready():
                continue
            self._turn = index + 1
            return peer
        return None

    def _matching(self, message: Message, sender: Any) -> bool:
        """Whether some member would take ``message`` once it has room."""
        return any(_takes(p, f, message, sender) for p, f in self.members.items())

    def _keep(self, message: Message, first: bool = False) -> None:
        """Hold ``message``; past the bound the oldest go. A redelivered one (``first``)
        goes to the front and trims nothing: it was in memory already (the member that
        left held it), so nothing is lost at once, and the next message kept trims."""
        cost = held_cost(message)
        self.backlog_bytes += cost
        if first:
            self.backlog.appendleft(message)
            self._costs.appendleft(cost)
            return
        self.backlog.append(message)
        self._costs.append(cost)
        while self.backlog_bytes > self.limit and len(self.backlog) > 1:
            self._let_go([self._take_first()], unmatched=False)

    def _take_first(self) -> Message:
        message = self.backlog.popleft()
        self.backlog_bytes -= self._costs.popleft()
        return message

    def _let_go(self, messages: list[Message], unmatched: bool) -> None:
        """Messages the group gives up: no member's filters match them any more
        (``unmatched``), or no room is left for them. Here they are dropped (counted)."""
        self._dropped(len(messages))

    def _dropped(self, count: int) -> None:
        if self.on_drop is not None:
            self.on_drop(count)


def _takes(peer: Any, filters: tuple[Filter, ...], message: Message, sender: Any) -> bool:
    """Whether ``peer`` would take ``message``: not its sender, its filters match, and its
    protocol can carry it."""
    if peer is sender or (filters and not matches_all(filters, message.properties)):
        return False
    return message.encoded(peer.encode) is not None


def _deliver_to(peer: Any, message: Message, group: QueueGroup) -> None:
    frame: bytes = message.encoded(peer.encode)  # type: ignore[assignment]  # _takes said so
    if group.on_deliver is not None:
        group.on_deliver(peer, message)
    deliver_queued = getattr(peer, "deliver_queued", None)
    if deliver_queued is not None:
        kept = deliver_queued(frame, message, group)
    else:
        peer.send(frame)
        kept = False
    if not kept and group.tracks_acks:
        group.acked(message)  # a member without acknowledgements: done once sent
