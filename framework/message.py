"""The values that travel through the hub: messages and routing results.

A :class:`Message` is protocol-neutral. Each protocol turns it into bytes with an
*encoder* (``Callable[[Message], bytes | None]``); :meth:`Message.encoded` memoizes that
per encoder so a message fanned out to many recipients of one protocol is encoded once.
An encoder returns ``None`` when its protocol cannot carry the message (too large, a topic
that is not a valid name in that protocol...): the hub then skips those recipients and
counts the skip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from attrs import field, frozen


class Kind(StrEnum):
    """What a message is. The value is what logs and the journal show."""

    MCAST = "mcast"  #: published on a topic, to its subscribers
    UCAST = "ucast"  #: sent to one identity
    BCAST = "bcast"  #: sent to every peer sharing a topic with the sender
    SUBSCRIBE = "subscribe"  #: presence: ``sender`` joined ``topic``
    UNSUBSCRIBE = "unsubscribe"  #: presence: ``sender`` left ``topic``


Encoder = Callable[["Message"], "bytes | None"]

#: The identity of anonymous senders (SSMP's reserved ``.``).
ANONYMOUS = "."


@frozen(slots=True, weakref_slot=False)
class Message:
    """One routed message.

    ``topic`` is the topic for MCAST and presence, the target identity for UCAST and
    ``None`` for BCAST. ``payload`` is the application's bytes, never altered.
    ``properties`` are typed application properties (Micromessage2 filters read them);
    ``encoding`` is a hint such as ``"json"`` carried by protocols that have one.
    ``presence`` is set on a SUBSCRIBE presence event when the member itself watches presence.
    """

    kind: Kind
    sender: str
    protocol: str
    topic: str | None
    payload: bytes = b""
    properties: Mapping[str, Any] | None = None
    encoding: str | None = None
    presence: bool = False
    _memo: dict[Encoder, bytes | None] = field(factory=dict, eq=False, repr=False)

    def encoded(self, encoder: Encoder) -> bytes | None:
        """``encoder(self)``, computed once per message and encoder."""
        memo = self._memo
        try:
            return memo[encoder]
        except KeyError:
            frame = memo[encoder] = encoder(self)
            return frame

    def preencode(self, encoder: Encoder, frame: bytes) -> None:
        """Record ``frame`` as this message's encoding by ``encoder``.

        The sending protocol uses this when it already holds the bytes (SSMP re-uses the
        request line), so no recipient of that protocol encodes again.
        """
        self._memo[encoder] = frame

    @property
    def origin_node(self) -> str | None:
        """The node (:attr:`msgbroker.Broker.node_name`) this message was published on,
        when that is another node of a cluster: a :class:`RemoteMessage`. ``None``: it was
        published on this broker. A property here, so local messages carry nothing more."""
        return None


@frozen(slots=True, weakref_slot=False)
class RemoteMessage(Message):
    """A message published on another node of a cluster, routed here by the cluster engine
    to this node's subscribers: ``origin_node`` names the node it was published on. The
    journal records it (column ``origin_node``), so that a report over every node's journal
    counts the message once, where it was published, and each node's deliveries of it::

        RemoteMessage(Kind.MCAST, "alice", "ssmp", "news", b"hi", origin_node="db1:4444")
    """

    origin_node: str = field(kw_only=True)


@frozen(slots=True, weakref_slot=False)
class MessageRun:
    """``count`` consecutive messages of one kind from one sender to one topic, routed in
    one go (a client pipelining publishes to a topic): one hub lookup, and one frame per
    recipient holding every message, instead of ``count`` of each.

    ``build_payloads()`` gives the messages' payloads, in order; it is called once, only
    when someone needs them. The individual :class:`Message` objects are built from those
    only when someone needs *them* (a protocol whose encoder has no run encoding, or a
    ``message_routed`` observer).

    An encoder may carry a *run encoding*: an attribute ``encode_run``, a callable taking
    the run and returning ``(frame, carried)`` exactly as :meth:`encoded` documents it, but
    computed without a :class:`Message` per payload (a template filled in per payload).

    ``wire`` is what the sending protocol knows of the run as it arrived (for STMP: the
    requests, already checked), for that protocol's own run encodings; others ignore it.
    """

    kind: Kind
    sender: str
    protocol: str
    topic: str
    count: int
    build_payloads: Callable[[], Sequence[bytes]] = field(eq=False, repr=False)
    wire: Any = field(default=None, eq=False, repr=False)
    #: the payloads' total size without building them, when the sender knows it cheaply
    #: (SSMP: from the request block's length); see :meth:`payload_bytes`
    total_bytes: Callable[[], int] | None = field(default=None, eq=False, repr=False)
    _memo: dict[Any, Any] = field(factory=dict, eq=False, repr=False)
    #: the node the run was published on when it is another node of a cluster (see
    #: :class:`RemoteMessage`); ``None``: published on this broker
    origin_node: str | None = field(default=None, kw_only=True)

    def payloads(self) -> Sequence[bytes]:
        """The payloads, in order, built once."""
        memo = self._memo
        payloads = memo.get(Sequence)
        if payloads is None:
            payloads = memo[Sequence] = self.build_payloads()
        return payloads

    def payload_bytes(self) -> int:
        """The payloads' total size: from ``total_bytes`` when the sender gave it (an
        observer such as the journal then costs no per-message work), else summed."""
        if self.total_bytes is not None:
            return self.total_bytes()
        return sum(map(len, self.payloads()))

    def messages(self) -> list[Message]:
        """The individual messages, built once."""
        memo = self._memo
        messages = memo.get(MessageRun)
        if messages is None:
            kind, sender, protocol, topic = self.kind, self.sender, self.protocol, self.topic
            origin = self.origin_node
            if origin is None:
                messages = [Message(kind, sender, protocol, topic, p) for p in self.payloads()]
            else:
                messages = [
                    RemoteMessage(kind, sender, protocol, topic, p, origin_node=origin)
                    for p in self.payloads()
                ]
            memo[MessageRun] = messages
        return messages

    def encoded(self, encoder: Encoder) -> tuple[bytes, int]:
        """``(frame, carried)``: every message ``encoder`` can carry, concatenated in order,
        and how many that is (the rest are skipped for that protocol). Computed once per
        encoder, by its run encoding when it has one."""
        memo = self._memo
        result = memo.get(encoder)
        if result is None:
            encode_run = getattr(encoder, "encode_run", None)
            if encode_run is not None:
                result = encode_run(self)
            else:
                frames = [m.encoded(encoder) for m in self.messages()]
                carried = [f for f in frames if f is not None]
                result = (b"".join(carried), len(carried))
            memo[encoder] = result
        return result

    def preencode(self, encoder: Encoder, frame: bytes) -> None:
        """Record the whole run's encoding by ``encoder`` (all ``count`` messages)."""
        self._memo[encoder] = (frame, self.count)


@frozen(slots=True)
class RouteResult:
    """What happened to one routed message, as the ``message_routed`` hook sees it.

    ``recipients`` counts deliveries per protocol name; ``skipped`` counts recipients whose
    protocol could not carry the message; ``dropped`` counts deliveries discarded by a
    slow-consumer policy.
    """

    recipients: Mapping[str, int]
    skipped: int = 0
    dropped: int = 0

    @property
    def delivered(self) -> int:
        return sum(self.recipients.values())
