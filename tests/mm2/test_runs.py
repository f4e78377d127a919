"""Pipelined Micromessage2 MESSAGEs: the codec's batches, and the server's run path, which
must give byte for byte what the same frames give one per write (the general path)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig, hookimpl, per_topic
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import (
    ExtensionFrame,
    Handshake,
    MessageBatch,
    MessageFrame,
    Subscribe,
)
from msgbroker.testing import connect, make_broker

# -- the codec ------------------------------------------------------------------------------------

DESTS = st.sampled_from(["a", "b", "@x"])
PAYLOADS = st.one_of(st.binary(max_size=8), st.binary(min_size=250, max_size=300))


@st.composite
def message_streams(draw):
    """Frames a client might send: numbered MESSAGEs (some with properties, some in two
    fragments), with COMMANDs between them."""
    frames, seq = [], draw(st.integers(1, 0xFFFF))
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["plain", "plain", "plain", "props", "fragments", "cmd"]))
        dest, payload = draw(DESTS), draw(PAYLOADS)
        if kind == "cmd":
            frames.append(codec.encode_pubsub(Subscribe("a")))
            continue
        if kind == "fragments":
            frames.append(MessageFrame(seq, dest, payload[:3], continued=True))
            frames.append(MessageFrame(seq, dest, payload[3:]))
        else:
            properties = {"n": 1} if kind == "props" else {}
            frames.append(MessageFrame(seq, dest, payload, properties))
        seq = codec.next_seq(seq)
    return frames


def expand(events):
    out = []
    for event in events:
        out.extend(event.frames() if type(event) is MessageBatch else [event])
    return out


@given(message_streams(), st.lists(st.integers(0, 2000), max_size=5))
def test_batches_expand_to_the_same_frames_however_the_stream_is_cut(frames, cuts):
    stream = b"".join(codec.encode_frame(f) for f in frames)
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = codec.FrameDecoder()
    events = []
    for lo, hi in zip([0, *points], [*points, len(stream)], strict=True):
        events.extend(decoder.feed_runs(stream[lo:hi]))
    assert all(len(e.payloads) >= 2 for e in events if type(e) is MessageBatch)
    assert expand(events) == frames


@given(st.binary(max_size=120))
@example(b"\x00\x00\x01\x01a\x00\x00\x01x\x00\x00\x02\x01a\x00\x00\x01y\x00\x00\x00")
def test_batches_fail_where_plain_decoding_fails(data):
    def decode(feed):
        out = []
        try:
            out.extend(feed(data))
        except RemoteProtocolError:
            return expand(out), "error"
        return expand(out), None

    assert decode(codec.FrameDecoder(max_payload=100).feed_runs) == decode(
        codec.FrameDecoder(max_payload=100).feed
    )


def test_consecutive_simple_messages_to_one_destination_are_one_batch():
    frames = [MessageFrame(65534 + i if i < 2 else i - 1, "t", b"%d" % i) for i in range(3)]
    stream = b"".join(codec.encode_frame(f) for f in frames)
    (batch,) = codec.FrameDecoder().feed_runs(stream)
    assert batch == MessageBatch(65534, "t", [b"0", b"1", b"2"])  # across the wrap
    assert batch.frames() == frames


# -- the server: a run against the same frames one per write --------------------------------------


def client(broker, identity, optional=("pubsub",)):
    conn = connect(broker, "mm2")
    hello = Handshake(identity, (), codec.parse_extension_list(";".join(optional)))
    conn.send(codec.encode_handshake(hello) + codec.encode_handshake(hello))
    conn.received()
    return conn, codec.active_extensions(hello)


def world(plugins=()):
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=plugins)
    plain, _ = client(broker, "plain")
    windowed, active = client(broker, "windowed", ("pubsub", "batch-ack:max-count=3"))
    typed, _ = client(broker, "typed", ("pubsub", "dotnet"))
    for conn in (plain, windowed, typed):
        conn.send(codec.encode_frame(codec.encode_pubsub(Subscribe("a"))))
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN x open x\nSUBSCRIBE a\nSUBSCRIBE b\n")
    stmp = connect(broker, "stmp")
    stmp.send(
        b"\x50\x00\x01\x00\x00\x01\x01\x00\x00\x00\x1a" + b'{"id":"s","scheme":"open"}'
        b"\x50\x00\x02\x00\x00\x01\x02\x00\x00\x00\x0d" + b'{"topic":"a"}'
    )
    for conn in (plain, windowed, typed, ssmp, stmp):
        conn.received()
    publisher, pub_active = client(broker, "pub", ("pubsub", "dotnet", "batch-ack"))
    publisher.received()
    subscribers = [plain, windowed, typed, ssmp, stmp]
    return broker, publisher, pub_active, subscribers, active.id_of("batch-ack")


@st.composite
def publishes(draw):
    items, seq = [], 0
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["plain"] * 5 + ["props", "type", "ucast", "fragments"]))
        seq = codec.next_seq(seq)
        payload, dest = draw(PAYLOADS), draw(st.sampled_from(["a", "a", "b"]))
        if kind == "type":
            items.append(("ext", draw(st.sampled_from([b"T1", b"T2"]))))
            items.append(("frame", MessageFrame(seq, dest, payload)))
        elif kind == "props":
            items.append(("frame", MessageFrame(seq, dest, payload, {"n": 2})))
        elif kind == "ucast":
            items.append(("frame", MessageFrame(seq, "@plain", payload)))
        elif kind == "fragments":
            items.append(("frame", MessageFrame(seq, dest, payload[:2], continued=True)))
            items.append(("frame", MessageFrame(seq, dest, payload[2:])))
        else:
            items.append(("frame", MessageFrame(seq, dest, payload)))
    return items


def encode(item, dotnet_id):
    kind, value = item
    if kind == "ext":
        return codec.encode_frame(ExtensionFrame(dotnet_id, value))
    return codec.encode_frame(value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(publishes())
@example([("frame", MessageFrame(i, "a", b"m%d" % i)) for i in range(1, 6)])  # one run
@pytest.mark.parametrize("guarded", [False, True])
def test_pipelined_messages_give_what_one_at_a_time_gives(guarded, items):
    """Also under an authorization hook that decides per topic (it refuses "b": the
    publisher is closed at its first message there, either way)."""
    fast = world([PerTopicGuard()] if guarded else [])
    slow = world([PerTopicGuard()] if guarded else [])
    dotnet_id = fast[2].id_of("dotnet")
    fast[1].send(b"".join(encode(item, dotnet_id) for item in items))  # one write: batches
    for item in items:
        slow[1].send(encode(item, dotnet_id))  # one frame per write: the general path
    fast_broker, fast_pub, _, fast_subs, ack_id = fast
    slow_broker, slow_pub, _, slow_subs, _ = slow
    # acks come one per chunk read: the last one acknowledges the same message either way
    fast_acks = list(codec.FrameDecoder().feed(fast_pub.received()))
    slow_acks = list(codec.FrameDecoder().feed(slow_pub.received()))
    assert fast_acks[-1] == slow_acks[-1]
    for f, s in zip(fast_subs, slow_subs, strict=True):
        assert f.received() == s.received()
    # the windowed subscriber acks what it got: the rest comes the same way too
    for conn in (fast_subs[1], slow_subs[1]):
        conn.send(codec.encode_frame(ExtensionFrame(ack_id, b"\x00\x03")))
    assert fast_subs[1].received() == slow_subs[1].received()
    assert fast[0].hub.stats == slow[0].hub.stats


@pytest.mark.parametrize("count", [2, 300])
def test_a_batch_is_routed_as_one_run(count):
    broker, publisher, _, subscribers, _ = world()
    stream = b"".join(
        codec.encode_frame(MessageFrame(i, "a", b"x%d" % i)) for i in range(1, count + 1)
    )
    publisher.send(stream)
    plain = subscribers[0]
    got = list(codec.FrameDecoder().feed(plain.received()))
    assert got == [MessageFrame(i, "a", b"x%d" % i) for i in range(1, count + 1)]
    assert broker.hub.stats.routed == count


class PerTopicGuard:
    """Decides per topic (msgbroker.per_topic): "b" is refused; counts what it is asked."""

    def __init__(self):
        self.asked = 0

    @hookimpl
    @per_topic
    def msgbroker_authorize(self, session, action, topic):
        self.asked += 1
        return topic != "b"


def test_a_per_topic_hook_is_asked_once_for_a_batch_it_allows():
    guard = PerTopicGuard()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[guard])
    (subscriber, _), (publisher, _) = client(broker, "s"), client(broker, "p")
    subscriber.send(codec.encode_frame(codec.encode_pubsub(Subscribe("a"))))
    asked = guard.asked
    publisher.send(
        b"".join(codec.encode_frame(MessageFrame(i, "a", b"x%d" % i)) for i in (1, 2, 3))
    )
    got = list(codec.FrameDecoder().feed(subscriber.received()))
    assert got == [MessageFrame(i, "a", b"x%d" % i) for i in (1, 2, 3)]
    assert guard.asked == asked + 1


def test_a_batch_a_per_topic_hook_refuses_is_refused_at_its_first_message():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[PerTopicGuard()])
    publisher, _ = client(broker, "p")
    publisher.send(b"".join(codec.encode_frame(MessageFrame(i, "b", b"x")) for i in (1, 2, 3)))
    (error,) = codec.FrameDecoder().feed(publisher.received())
    assert error == codec.ErrorFrame("not allowed to publish to 'b'")
    assert publisher.closed
    assert broker.hub.stats.routed == 0


def test_simple_messages_to_several_destinations_are_one_mixed_batch():
    frames = [MessageFrame(i, f"t{i % 3}", b"%d" % i) for i in range(1, 6)]
    stream = b"".join(codec.encode_frame(f) for f in frames)
    (batch,) = codec.FrameDecoder().feed_runs(stream)
    assert batch == MessageBatch(1, "t1", [b"1", b"2", b"3", b"4", b"5"],
                                 ["t1", "t2", "t0", "t1", "t2"])  # fmt: skip
    assert batch.frames() == frames


def test_a_mixed_batch_reaches_each_destination_in_order():
    broker, publisher, _, subscribers, _ = world()
    stream = b"".join(
        codec.encode_frame(MessageFrame(i, "ab"[i % 2], b"x%d" % i)) for i in range(1, 7)
    )
    publisher.send(stream)
    got = list(codec.FrameDecoder().feed(subscribers[0].received()))  # on "a" only
    assert got == [MessageFrame(i, "a", b"x%d" % j) for i, j in enumerate((2, 4, 6), 1)]
    assert subscribers[3].received() == b"".join(  # SSMP, on both
        b"000 pub MCAST %s x%d\n" % (b"ab"[i % 2 : i % 2 + 1], i) for i in range(1, 7)
    )
    assert broker.hub.stats.routed == 6
