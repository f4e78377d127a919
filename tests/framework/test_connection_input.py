"""How a connection hands its session what the transport knows and what it reads: options
for the session's constructor, and packets several per read, whose output is written once,
at the end of the reactor turn (msgbroker.connection.Connection; msgbroker.testing.SessionDriver
does the same sans-IO)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from msgbroker.connection import Connection, ServerSession
from msgbroker.message import Kind, Message
from msgbroker.reasons import CloseReason
from msgbroker.registry import ProtocolSpec
from msgbroker.testing import MemoryWire, RecordingTransportLink, drive, make_broker


def encode(message: Message) -> bytes:
    return b"<" + message.payload + b">"


class Echoing(ServerSession):
    """Publishes each input on topic ``t``; ``stop`` closes the connection."""

    name = "echoing"
    encode = staticmethod(encode)
    login_required = False

    def __init__(self, *args: Any, greeting: bytes = b"", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.greeting = greeting
        self.inputs: list[bytes] = []

    def opened(self) -> None:
        self.peer.identity = "me"
        if self.greeting:
            self.reply(self.greeting)

    def data_received(self, data: bytes) -> None:
        self.inputs.append(data)
        if data == b"stop":
            self.close(CloseReason.REQUESTED)
            return
        self.hub.multicast(None, Message(Kind.MCAST, "me", "echoing", "t", data))


def broker_with_a_subscriber() -> tuple[Any, MemoryWire]:
    broker = make_broker()
    broker.protocols["echoing"] = ProtocolSpec("echoing", session=Echoing)
    # a subscriber on another connection, so that deliveries go through the batcher
    wire = MemoryWire()
    Connection(broker, Echoing, RecordingTransportLink(), wire)
    subscriber = next(iter(broker.sessions))
    broker.hub.subscribe(subscriber, "t")
    return broker, wire


def test_options_reach_the_session_before_it_opens():
    broker, _ = broker_with_a_subscriber()
    wire = MemoryWire()
    link = RecordingTransportLink()
    connection = Connection(broker, Echoing, link, wire, options={"greeting": b"hi"})
    assert connection.server.greeting == b"hi"
    broker.reactor.advance(0)  # the end of the reactor turn
    assert bytes(wire.data) == b"hi"


def test_packets_go_in_order_and_are_written_once_at_the_end_of_the_turn():
    broker, subscriber = broker_with_a_subscriber()
    connection = Connection(broker, Echoing, RecordingTransportLink(), MemoryWire())
    connection.packets_received([b"a", b"b", b"c"])
    connection.data_received(b"d")  # another input read in the same reactor turn
    assert connection.server.inputs == [b"a", b"b", b"c", b"d"]
    assert subscriber.writes == []
    broker.reactor.advance(0)  # the end of the reactor turn
    assert subscriber.writes == [b"<a><b><c><d>"]  # one write for them all


def test_a_lazy_slice_stops_where_its_transport_stops_reading():
    broker, _ = broker_with_a_subscriber()
    link = RecordingTransportLink()
    connection = Connection(broker, Echoing, link, MemoryWire())

    def read() -> Iterator[bytes]:
        for packet in (b"a", b"stop", b"never read"):
            if link.ended:
                return
            yield packet

    connection.packets_received(read())
    assert connection.server.inputs == [b"a", b"stop"]
    assert link.ended == [(CloseReason.REQUESTED, False)]


def test_a_driven_session_gets_options_and_shows_each_write():
    broker, _ = broker_with_a_subscriber()
    driver = drive(broker, "echoing", greeting=b"hello")
    assert driver.server.greeting == b"hello"
    driver.server.reply(b"two")
    # a stream protocol's replies are batched: one write per reactor turn
    assert driver.received_packets() == [b"hellotwo"]
    driver.server.reply(b"three")
    assert driver.received() == b"three" and driver.received_packets() == []
