"""Micromessage2 sequence numbers and acks, sans-IO and pure.

Each direction numbers its MESSAGE frames 1, 2, ... 65535, then 1 again: 0 is never used,
so the numbers go round a cycle of 65535 (DECISIONS.md). The ``ack`` and ``batch-ack``
extensions acknowledge with an EXTENSION frame whose payload is one u16 seq, cumulative and
inclusive: it acknowledges every outstanding message up to and including that seq, across
the wrap.

The sender knows what it has outstanding: the ``outstanding`` messages sent since the last
ack, numbered consecutively from ``oldest``. That window is what makes a cumulative ack
unambiguous after the wrap: ack 1 with 65534, 65535 and 1 outstanding covers all three.
"""

from __future__ import annotations

from msgbroker.errors import RemoteProtocolError

from .frames import ExtensionFrame

#: how many sequence numbers there are (1..65535): the cycle they go round
SEQ_CYCLE = 0xFFFF


def _check(seq: int) -> None:
    if not 1 <= seq <= SEQ_CYCLE:
        raise ValueError(f"sequence number out of 1..65535: {seq}")


def next_seq(seq: int) -> int:
    """The number after ``seq``; ``next_seq(0)`` is 1, the first of a direction (so a
    counter starts at 0, meaning "nothing sent yet"). 65535 is followed by 1."""
    if seq != 0:
        _check(seq)
    return 1 if seq == SEQ_CYCLE else seq + 1


def seq_distance(start: int, seq: int) -> int:
    """How many steps :func:`next_seq` takes from ``start`` to ``seq``: 0..65534."""
    _check(start)
    _check(seq)
    return (seq - start) % SEQ_CYCLE


def acked_count(oldest: int, outstanding: int, ack: int) -> int:
    """How many of the ``outstanding`` messages (numbered from ``oldest``) the cumulative
    ``ack`` acknowledges: all of them up to ``ack``, or 0 when ``ack`` is none of them.

    An ack outside the window is a stale one (for messages already acknowledged: the spec
    lets a receiver ack early and again) or a bogus one; either way it acknowledges nothing.
    The spec's own loop would instead ack round the whole cycle until it met the number.
    """
    _check(oldest)
    if not 0 <= outstanding <= SEQ_CYCLE:
        raise ValueError(f"outstanding messages out of 0..65535: {outstanding}")
    offset = seq_distance(oldest, ack)
    return offset + 1 if offset < outstanding else 0


def is_acked(seq: int, ack: int, oldest: int) -> bool:
    """Whether the cumulative ``ack`` covers ``seq``, both in the window that starts at
    ``oldest`` (the oldest unacknowledged message)."""
    return seq_distance(oldest, seq) <= seq_distance(oldest, ack)


def ack_frame(ext_id: int, seq: int) -> ExtensionFrame:
    """The EXTENSION frame acknowledging every message up to ``seq`` (``ext_id`` is the
    ``ack`` or ``batch-ack`` extension's handshake index)."""
    _check(seq)
    return ExtensionFrame(ext_id, seq.to_bytes(2, "big"))


def parse_ack(frame: ExtensionFrame) -> int:
    """The seq an ack frame carries (the caller knows the frame's extension is an ack)."""
    if len(frame.payload) != 2:
        raise RemoteProtocolError(f"ack payload of {len(frame.payload)} bytes (must be 2)")
    seq = int.from_bytes(frame.payload, "big")
    if seq == 0:
        raise RemoteProtocolError("ack of sequence number 0 (they start at 1)")
    return seq
