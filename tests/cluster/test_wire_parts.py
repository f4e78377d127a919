"""A per-node publication built from runs packed once each (clusterwire.packed_items and
messages_body) is byte for byte the publication of all its items packed together, at every
size where msgpack's array header changes."""

from __future__ import annotations

from itertools import pairwise

import pytest

from msgbroker import clusterwire as wire
from msgbroker.message import Kind, Message


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 300, 65_535, 65_536, 70_000])
@pytest.mark.parametrize("cuts", [(), (1,), (3, 7)])
def test_parts_make_the_body_of_the_whole(size: int, cuts: tuple[int, ...]) -> None:
    items = [
        wire.message_item(Message(Kind.MCAST, "s", "ssmp", f"t{i % 3}", b"%d" % i))
        for i in range(size)
    ]
    bounds = [0, *(min(cut, size) for cut in cuts), size]
    parts = [wire.packed_items(items[a:b]) for a, b in pairwise(bounds)]
    whole = wire.body(wire.MESSAGES, items)
    assert wire.messages_body(parts, size) == whole
    _, _, op, decoded = wire.decode(wire.header("n", "e") + whole)
    assert (op, len(decoded)) == (wire.MESSAGES, size)
