"""A queue group's stream entries (``clusterwire.entry`` / ``read_entry``): each holds one
MCAST and the node it was published on, so that the node that reads it delivers it as a
message from that node (the journal counts it where it was published, not again where it
is read); anything else in a stream is refused with ``WireError``, never a crash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgbroker import clusterwire as wire
from msgbroker.message import Kind, Message, MessageRun, RemoteMessage


def test_an_entry_carries_its_message_and_the_node_it_was_published_on() -> None:
    message = Message(Kind.MCAST, "alice", "ssmp", "news", b"hi")
    read = wire.read_entry(wire.entry(message, "db1:4444"))
    assert isinstance(read, RemoteMessage)
    assert read.origin_node == "db1:4444"
    assert (read.kind, read.sender, read.protocol, read.topic, read.payload) == (
        Kind.MCAST, "alice", "ssmp", "news", b"hi"
    )  # fmt: skip


def test_a_run_becomes_one_entry_per_message_in_order() -> None:
    payloads = [b"one", b"two", b"three"]
    run = MessageRun(Kind.MCAST, "bob", "stmp", "t", 3, lambda: payloads)
    read = [wire.read_entry(data) for data in wire.run_entries(run, "web2:4444")]
    assert [m.payload for m in read] == payloads
    assert {(m.sender, m.protocol, m.topic, m.origin_node) for m in read} == {  # type: ignore[attr-defined]
        ("bob", "stmp", "t", "web2:4444")
    }


MCAST = Message(Kind.MCAST, "a", "p", "t", b"x")


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1",  # not msgpack
        msgpack.packb(["x"]),  # not a pair
        msgpack.packb([1, ["mcast", "a", "p", "t", b"x", None, None, False]]),  # origin
        # well-formed items that are not an MCAST: a broadcast, a UCAST
        wire.pack(["n", wire.broadcast_item(Message(Kind.BCAST, "a", "p", None, b"x"), ["t"])]),
        wire.pack(["n", wire.message_item(Message(Kind.UCAST, "a", "p", "bob", b"x"))]),
        # an MCAST whose payload is text
        wire.pack(["n", [*wire.message_item(MCAST)[:4], "text", None, None, False]]),
    ],
)
def test_anything_else_in_a_stream_is_a_wire_error(data: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.read_entry(data)


@given(st.binary(max_size=200))
def test_random_bytes_are_an_entry_or_a_wire_error(data: bytes) -> None:
    try:
        message = wire.read_entry(data)
    except wire.WireError:
        return
    assert message.kind is Kind.MCAST
