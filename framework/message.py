"""The values that travel through the hub: messages and routing results.

A :class:`Message` is protocol-neutral. Each protocol turns it into bytes with an
*encoder* (``Callable[[Message], bytes | None]``); :meth:`Message.encoded` memoizes that
per encoder so a message fanned out to many recipients of one protocol is encoded once.
An encoder returns ``None`` when its protocol cannot carry the message (too large, a topic
that is not a valid name in that protocol...): the hub then skips those recipients and
counts the skip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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


@frozen(slots=True, weakref_slot=False)
class MessageRun:
    """``count`` consecutive messages of one kind from one sender to one topic, routed in
    one go (a client pipelining publishes to a topic): one hub lookup, and one frame per
    recipient holding every message, instead of ``count`` of each.

    ``build()`` makes the individual :class:`Message` objects, only when someone needs
    them (a protocol without a run encoding, or a ``message_routed`` observer).
    """

    kind: Kind
    sender: str
    protocol: str
    topic: str
    count: int
    build: Callable[[], list[Message]] = field(eq=False, repr=False)
    _memo: dict[Any, Any] = field(factory=dict, eq=False, repr=False)

    def messages(self) -> list[Message]:
        """The individual messages, built once."""
        memo = self._memo
        messages = memo.get(MessageRun)
        if messages is None:
            messages = memo[MessageRun] = self.build()
        return messages

    def encoded(self, encoder: Encoder) -> tuple[bytes, int]:
        """``(frame, carried)``: every message ``encoder`` can carry, concatenated, and how
        many that is (the rest are skipped for that protocol). Computed once per encoder."""
        memo = self._memo
        result = memo.get(encoder)
        if result is None:
            frames = [m.encoded(encoder) for m in self.messages()]
            carried = [f for f in frames if f is not None]
            result = memo[encoder] = (b"".join(carried), len(carried))
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
