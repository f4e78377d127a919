"""The Micromessage2 server in memory (a broker on a Clock, StringTransport connections):
the handshake, pubsub, messages both ways and to other protocols, unicast, acks and windows,
queue groups, and what bad input gets (an ERROR frame, then close)."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, hookimpl
from msgbroker.filters import Filter
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import (
    Command,
    ErrorFrame,
    ExtensionFrame,
    Handshake,
    MessageFrame,
    Subscribe,
    Unsubscribe,
)
from msgbroker.plugins.mm2.extensions import ExtensionHandler, ExtensionSpec
from msgbroker.testing import connect, make_broker


@pytest.fixture
def broker():
    return make_broker(BrokerConfig(auth=("open",)))


class Client:
    """One in-memory Micromessage2 client connection past the handshake, speaking through
    the codec."""

    def __init__(self, conn, reply, active):
        self.conn, self.reply, self.active = conn, reply, active
        self.seq = 0
        self.frames = codec.FrameDecoder()

    def send(self, *frames):
        self.conn.send(b"".join(codec.encode_frame(f) for f in frames))

    def publish(self, destination, payload, **properties):
        self.seq = codec.next_seq(self.seq)
        self.send(MessageFrame(self.seq, destination, payload, properties))

    def subscribe(self, destination, queue=None, filters=()):
        self.send(codec.encode_pubsub(Subscribe(destination, queue, tuple(filters))))

    def received(self):
        return list(self.frames.feed(self.conn.received()))


def client(broker, identity, required=(), optional=("pubsub",)):
    """A client through all three steps, with ``required`` and ``optional`` (extension list
    items, ``name[:key=value]``) confirmed as they are."""
    conn = connect(broker, "mm2")
    hello = Handshake(
        identity,
        codec.parse_extension_list(";".join(required)),
        codec.parse_extension_list(";".join(optional)),
    )
    conn.send(codec.encode_handshake(hello))
    reply = codec.HandshakeDecoder().feed(conn.received())
    assert isinstance(reply, Handshake), reply
    conn.send(codec.encode_handshake(hello))  # step 3: the same lists
    return Client(conn, reply, codec.active_extensions(hello))


def test_the_server_answers_the_hello_with_its_extensions(broker):
    conn = connect(broker, "mm2")
    conn.send(codec.encode_handshake(Handshake("hulk", (), ("pubsub",), minor=0)))
    reply = codec.HandshakeDecoder().feed(conn.received())
    assert reply == Handshake("msgbroker", (), ("pubsub", "batch-ack"), minor=1)
    assert not conn.closed


def test_the_reply_suggests_the_clients_supported_optional_extensions_like_it_then_ours(broker):
    conn = connect(broker, "mm2")
    optional = codec.parse_extension_list("json;x-unknown;batch-ack:max-count=100")
    conn.send(codec.encode_handshake(Handshake("hulk", (), optional)))
    reply = codec.HandshakeDecoder().feed(conn.received())
    assert codec.encode_extension_list(reply.optional) == "json;batch-ack:max-count=100;pubsub"


def test_an_unsupported_required_extension_is_an_error_frame_and_close(broker):
    conn = connect(broker, "mm2")
    conn.send(codec.encode_handshake(Handshake("hulk", ("x-foo",))))
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert error == ErrorFrame("unsupported extensions: x-foo")
    assert conn.closed


def test_major_2_is_refused(broker):
    conn = connect(broker, "mm2")
    conn.send(codec.encode_handshake(Handshake("hulk", major=2)))
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert isinstance(error, ErrorFrame)
    assert conn.closed


def test_messages_reach_subscribers_of_every_protocol_and_back(broker):
    sub = client(broker, "sub")
    sub.subscribe("t")
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open x\nSUBSCRIBE t\n")
    ssmp.received()
    pub = client(broker, "pub")
    pub.publish("t", b"hello", n=5)
    (message,) = sub.received()
    assert message == MessageFrame(1, "t", b"hello", {"n": 5})
    assert ssmp.received() == b"000 pub MCAST t hello\n"
    ssmp.send(b"MCAST t from-ssmp\n")
    assert sub.received() == [MessageFrame(2, "t", b"from-ssmp")]


def test_filters_and_unsubscribe(broker):
    sub = client(broker, "sub")
    sub.subscribe("t", filters=[Filter("n", ">", 10)])
    pub = client(broker, "pub")
    pub.publish("t", b"small", n=5)
    pub.publish("t", b"big", n=50)
    pub.publish("t", b"none")
    assert [m.payload for m in sub.received()] == [b"big"]
    sub.send(codec.encode_pubsub(Unsubscribe("t")))
    pub.publish("t", b"after", n=50)
    assert sub.received() == []


def test_unicast_both_ways(broker):
    a, b = client(broker, "a"), client(broker, "b")
    a.publish("@b", b"hi")
    assert b.received() == [MessageFrame(1, "@a", b"hi")]
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open x\nUCAST b yo\n")
    assert b.received() == [MessageFrame(2, "@s", b"yo")]
    b.publish("@s", b"back")
    assert ssmp.received().endswith(b"000 b UCAST s back\n")


def test_batch_ack_window_holds_output_until_acked(broker):
    sub = client(broker, "sub", optional=("pubsub", "batch-ack:max-count=2"))
    ack_id = sub.active.id_of("batch-ack")
    sub.subscribe("t")
    pub = client(broker, "pub")
    for i in range(5):
        pub.publish("t", b"%d" % i)
    assert [m.seq for m in sub.received()] == [1, 2]  # the window
    sub.send(ExtensionFrame(ack_id, (2).to_bytes(2, "big")))
    assert [m.seq for m in sub.received()] == [3, 4]
    sub.send(ExtensionFrame(ack_id, (3).to_bytes(2, "big")))
    assert [m.payload for m in sub.received()] == [b"4"]


def test_the_server_acks_the_clients_messages_once_per_chunk(broker):
    pub = client(broker, "pub", optional=("pubsub", "batch-ack"))
    ack_id = pub.active.id_of("batch-ack")
    frames = []
    for _ in range(3):
        pub.seq = codec.next_seq(pub.seq)
        frames.append(MessageFrame(pub.seq, "t", b"x"))
    pub.send(*frames)
    assert pub.received() == [ExtensionFrame(ack_id, (3).to_bytes(2, "big"))]


def test_an_ack_for_a_number_never_sent_is_a_protocol_error(broker):
    sub = client(broker, "sub", optional=("pubsub", "ack"))
    sub.send(ExtensionFrame(sub.active.id_of("ack"), (7).to_bytes(2, "big")))
    (error,) = sub.received()
    assert isinstance(error, ErrorFrame)
    assert sub.conn.closed


def test_queue_group_members_share_and_unacked_ones_are_redelivered(broker):
    a = client(broker, "a", optional=("pubsub", "ack"))
    b = client(broker, "b", optional=("pubsub", "ack"))
    for c in (a, b):
        c.subscribe("jobs", queue="workers")
    pub = client(broker, "pub")
    for i in range(3):
        pub.publish("jobs", b"%d" % i)
    assert [m.payload for m in a.received()] == [b"0"]  # ack: a window of one each
    assert [m.payload for m in b.received()] == [b"1"]
    a.conn.drop()  # a goes without acking "0": it goes to b, ahead of the waiting "2"
    b.send(ExtensionFrame(b.active.id_of("ack"), (1).to_bytes(2, "big")))
    assert [m.payload for m in b.received()] == [b"0"]
    b.send(ExtensionFrame(b.active.id_of("ack"), (2).to_bytes(2, "big")))
    assert [m.payload for m in b.received()] == [b"2"]


def test_json_refuses_a_payload_that_is_not_json(broker):
    c = client(broker, "j", optional=("pubsub", "json"))
    c.publish("t", b'{"ok": 1}')
    assert not c.conn.closed
    c.publish("t", b"not json")
    (error,) = c.received()
    assert isinstance(error, ErrorFrame)
    assert c.conn.closed


def test_garbage_after_the_handshake_is_an_error_frame_and_close(broker):
    c = client(broker, "g")
    c.conn.send(b"\xe0garbage")
    (error,) = c.received()
    assert isinstance(error, ErrorFrame)
    assert c.conn.closed


def test_a_message_out_of_sequence_is_a_protocol_error(broker):
    c = client(broker, "s")
    c.send(MessageFrame(5, "t", b"x"))
    (error,) = c.received()
    assert "due" in error.text
    assert c.conn.closed


def test_an_unknown_command_is_a_protocol_error(broker):
    c = client(broker, "u")
    c.send(Command("frobnicate"))
    (error,) = c.received()
    assert isinstance(error, ErrorFrame)


class CountIncoming(ExtensionHandler):
    seen: list = []

    def incoming(self, message):
        CountIncoming.seen.append(message.payload)
        return message


class VendorPlugin:
    @hookimpl
    def msgbroker_register_mm2_extensions(self, register):
        register(ExtensionSpec("x-count", CountIncoming, offer=True))


def test_a_third_party_extension_is_offered_and_sees_messages():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[VendorPlugin()])
    CountIncoming.seen = []
    c = client(broker, "v", optional=("pubsub", "x-count"))
    assert "x-count" in [e.name for e in c.reply.optional]
    c.publish("t", b"counted")
    assert CountIncoming.seen == [b"counted"]


def test_a_dotnet_type_travels_with_the_messages_to_dotnet_subscribers_only(broker):
    typed = client(broker, "typed", optional=("pubsub", "json", "dotnet"))
    plain = client(broker, "plain")
    for c in (typed, plain):
        c.subscribe("t")
    pub = client(broker, "pub", optional=("pubsub", "dotnet"))
    pub_dotnet = pub.active.id_of("dotnet")
    pub.send(ExtensionFrame(pub_dotnet, b"Orders.Created, Orders"))
    pub.publish("t", b"{}")
    pub.publish("t", b"{}")  # same type: no second type frame
    pub.send(ExtensionFrame(pub_dotnet, b"Orders.Shipped, Orders"))
    pub.publish("t", b"{}")
    own = typed.active.id_of("dotnet")  # 3 for this subscriber (json is 2), not pub's 2
    assert own != pub_dotnet
    assert typed.received() == [
        ExtensionFrame(own, b"Orders.Created, Orders"),
        MessageFrame(1, "t", b"{}"),
        MessageFrame(2, "t", b"{}"),
        ExtensionFrame(own, b"Orders.Shipped, Orders"),
        MessageFrame(3, "t", b"{}"),
    ]
    assert plain.received() == [MessageFrame(i, "t", b"{}") for i in (1, 2, 3)]
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open x\nSUBSCRIBE t\n")
    ssmp.received()
    pub.publish("t", b"{}")
    assert ssmp.received() == b"000 pub MCAST t {}\n"  # other protocols never see types


def test_a_run_of_pipelined_ssmp_mcasts_is_numbered_message_by_message(broker):
    sub = client(broker, "sub", optional=("pubsub", "batch-ack:max-count=2"))
    sub.subscribe("t")
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open x\n" + b"".join(b"MCAST t m%d\n" % i for i in range(4)))
    assert sub.received() == [MessageFrame(1, "t", b"m0"), MessageFrame(2, "t", b"m1")]
    sub.send(ExtensionFrame(sub.active.id_of("batch-ack"), (2).to_bytes(2, "big")))
    assert sub.received() == [MessageFrame(3, "t", b"m2"), MessageFrame(4, "t", b"m3")]


def test_a_consumer_that_never_acks_is_cut_off_past_the_backlog_and_others_go_on():
    broker = make_broker(BrokerConfig(auth=("open",), max_backlog=1000))
    stuck = client(broker, "stuck", optional=("pubsub", "ack"))
    other = client(broker, "other")
    for c in (stuck, other):
        c.subscribe("t")
    pub = client(broker, "pub")
    for i in range(20):
        pub.publish("t", b"%03d" % i + b"x" * 97)  # 2,000 bytes in all
    assert [m.seq for m in stuck.received()] == [1]  # its window, then nothing
    broker.reactor.advance(0)  # the close comes once the fan-out is over
    assert stuck.conn.closed  # what waited for its acks outgrew --max-backlog
    assert len(other.received()) == 20
    assert not pub.conn.closed
