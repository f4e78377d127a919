"""Micromessage2 payloads over 1 MiB, sans-IO: :func:`split_message` cuts an outgoing
message into MESSAGE frames, :class:`Reassembler` joins incoming ones.

Every fragment but the last carries CONTINUED; each repeats the seq and the destination;
only the first carries the properties (DECISIONS.md). A message is acknowledged once, by
its seq, whatever the number of its fragments.
"""

from __future__ import annotations

import attrs

from msgbroker.errors import RemoteProtocolError

from .frames import FRAGMENT_SIZE, MessageFrame, encode_frame

#: the largest reassembled payload accepted unless configured (like STMP's default)
DEFAULT_MAX_MESSAGE = 16 << 20


def split_message(message: MessageFrame, fragment_size: int = FRAGMENT_SIZE) -> list[MessageFrame]:
    """``message`` as the frames that carry it: itself when its payload is at most
    ``fragment_size`` (1 MiB: the spec splits payloads *larger* than that), else fragments
    of ``fragment_size`` bytes and a shorter last one. An empty payload is one frame."""
    if message.continued:
        raise ValueError("split a whole message, not a fragment (continued is set)")
    if fragment_size < 1:
        raise ValueError(f"fragment size must be positive: {fragment_size}")
    payload = message.payload
    if len(payload) <= fragment_size:
        return [message]
    starts = range(0, len(payload), fragment_size)
    last = starts[-1]
    return [
        MessageFrame(
            message.seq,
            message.destination,
            payload[start : start + fragment_size],
            message.properties if start == 0 else (),
            continued=start != last,
        )
        for start in starts
    ]


def encode_message(message: MessageFrame, fragment_size: int = FRAGMENT_SIZE) -> bytes:
    """The bytes of every frame :func:`split_message` gives, one after the other."""
    return b"".join(encode_frame(frame) for frame in split_message(message, fragment_size))


class Reassembler:
    """Joins the MESSAGE frames of one connection's direction into whole messages.

    Feed it every MESSAGE frame in the order received (other frames may come between
    fragments and do not concern it). It returns the whole message — a
    :class:`MessageFrame` with ``continued`` false, the first fragment's properties and
    every fragment's payload — or None while fragments are still due. Errors are the
    peer's: a fragment whose seq or destination differs from the first (a message cannot
    interleave with another), properties on a later fragment, a total over
    ``max_message``.
    """

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self._max = max_message
        self._first: MessageFrame | None = None
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def in_progress(self) -> bool:
        """True between a message's first fragment and its last."""
        return self._first is not None

    def feed(self, frame: MessageFrame) -> MessageFrame | None:
        first = self._first
        if first is None:
            if len(frame.payload) > self._max:
                raise RemoteProtocolError(
                    f"message of {len(frame.payload)} bytes exceeds {self._max}"
                )
            if not frame.continued:
                return frame  # the common case: a message in one frame
            self._first, self._parts, self._size = frame, [frame.payload], len(frame.payload)
            return None
        if frame.seq != first.seq or frame.destination != first.destination:
            raise RemoteProtocolError(
                f"fragment of message {frame.seq} to {frame.destination[:40]!r} while"
                f" message {first.seq} to {first.destination[:40]!r} is incomplete"
            )
        if frame.properties:
            raise RemoteProtocolError("properties on a fragment other than the first")
        self._size += len(frame.payload)
        if self._size > self._max:
            raise RemoteProtocolError(f"message of over {self._max} bytes in fragments")
        self._parts.append(frame.payload)
        if frame.continued:
            return None
        payload = b"".join(self._parts)
        self._first, self._parts, self._size = None, [], 0
        return attrs.evolve(first, payload=payload, continued=False)
