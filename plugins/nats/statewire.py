"""What the NATS engine itself sends besides the cluster's opaque bytes (sans-IO): a node's
state in answer to "what is your state?", in parts that each fit the server's
``max_payload``, and an announcement of many changes split the same way.

A state part is msgpack ``[1, node, index, count, [field, value, field, value, ...]]``
(``count`` parts, ``index`` from 0; fields and values are :mod:`msgbroker.clusterwire`'s
opaque bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]

from msgbroker import clusterwire as wire

VERSION = 1
#: msgpack's cost around each field or value, counted generously
_ITEM_OVERHEAD = 10


class StateWireError(ValueError):
    """Bytes that are no state part of this version."""


def _chunks(sizes: Iterable[tuple[Any, int]], limit: int) -> list[list[Any]]:
    parts: list[list[Any]] = [[]]
    size = 0
    for item, item_size in sizes:
        if size + item_size > limit and parts[-1]:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += item_size
    return parts


def state_parts(node: str, state: Mapping[bytes, bytes], limit: int) -> list[bytes]:
    """``state`` as parts of about ``limit`` bytes at most (a field larger than that
    alone makes a larger part)."""
    pairs = _chunks(
        (((k, v), len(k) + len(v) + 2 * _ITEM_OVERHEAD) for k, v in state.items()), limit
    )
    return [
        msgpack.packb(
            [VERSION, node, index, len(pairs), [x for pair in part for x in pair]],
            use_bin_type=True,
        )
        for index, part in enumerate(pairs)
    ]


def read_part(data: bytes) -> tuple[str, int, int, list[bytes]]:
    """``(node, index, count, flat fields and values)``; StateWireError for anything else."""
    try:
        version, node, index, count, flat = msgpack.unpackb(data, raw=False)
    except Exception:  # msgpack raises several kinds for bad input
        raise StateWireError("not msgpack") from None
    if (
        version != VERSION
        or not isinstance(node, str)
        or not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count)
        or not isinstance(flat, list)
        or len(flat) % 2
        or not all(isinstance(x, bytes) for x in flat)
    ):
        raise StateWireError("not a state part")
    return node, index, count, flat


def split_changes(
    data: bytes, changes: Sequence[tuple[bytes, bytes | None]], limit: int
) -> list[bytes]:
    """``data`` (an announcement of ``changes``) as announcements of at most about
    ``limit`` bytes of changes each, with ``data``'s header (who sends them)."""
    unpacker = msgpack.Unpacker(raw=True)  # only its length is wanted
    unpacker.feed(data)
    unpacker.unpack()
    head = data[: unpacker.tell()]
    parts = _chunks(
        (([k, v], len(k) + len(v or b"") + 2 * _ITEM_OVERHEAD) for k, v in changes), limit
    )
    return [head + wire.body(wire.CHANGES, part) for part in parts]
