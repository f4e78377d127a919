"""Pipelined STMP requests: the codec's runs, and the publish fast path (plugins/stmp/runs.py),
which must give byte for byte what the general path gives, request by request."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig, hookimpl, per_topic
from msgbroker.errors import RemoteProtocolError
from msgbroker.message import Kind, Message, MessageRun
from msgbroker.plugins.stmp import codec, payloads, runs
from msgbroker.plugins.stmp.codec import Encoding, Notify, Request, RequestRun, Response, Status
from msgbroker.plugins.stmp.encoders import delivery_encoder
from msgbroker.testing import connect, make_broker

PUBLISH = payloads.PUBLISH
JSON, MSGPACK = Encoding.JSON, Encoding.MSGPACK


def publish(ident: int, topic: str, data: str, encoding: int = JSON) -> bytes:
    body = payloads.encode_payload({"topic": topic, "data": data}, encoding)
    return codec.encode_binary(Request(ident, PUBLISH, encoding, body))


def raw_request(ident: int, payload: bytes, encoding: int = JSON) -> bytes:
    return codec.encode_binary(Request(ident, PUBLISH, encoding, payload))


# -- the codec: runs ---------------------------------------------------------------------------


def test_consecutive_requests_with_one_header_and_action_are_one_run():
    stream = b"".join(publish(i, "t", f"m{i}") for i in range(1, 4))
    (run,) = codec.BinaryDecoder().feed_runs(stream)
    assert type(run) is RequestRun
    assert (run.action, run.encoding, run.count, run.block) == (PUBLISH, JSON, 3, stream)
    assert run.requests() == list(codec.BinaryDecoder().feed(stream))


def test_a_different_action_encoding_or_kind_ends_a_run():
    a = publish(1, "t", "a")
    other_action = codec.encode_binary(Request(2, PUBLISH + 1, JSON, b"{}"))
    other_encoding = publish(3, "t", "b", MSGPACK)
    notify = codec.encode_binary(Notify(PUBLISH, JSON, b"{}"))
    stream = a + a + other_action + other_encoding + other_encoding + notify + a
    out = list(codec.BinaryDecoder().feed_runs(stream))
    assert [type(m).__name__ for m in out] == [
        "RequestRun", "Request", "RequestRun", "Notify", "Request"
    ]  # fmt: skip
    assert codec.expand_runs(out) == list(codec.BinaryDecoder().feed(stream))


def test_plain_feed_never_makes_runs():
    stream = publish(1, "t", "a") * 5
    assert all(type(m) is Request for m in codec.BinaryDecoder().feed(stream))


def test_a_run_stops_before_a_cut_off_request_and_an_oversized_one_is_refused():
    a = publish(1, "t", "abc")
    decoder = codec.BinaryDecoder(max_payload=64)
    out = list(decoder.feed_runs(a + a + a[:-2]))
    assert [m.count for m in out] == [2]
    assert list(decoder.feed(a[-2:])) == [Request(1, PUBLISH, JSON, a[11:])]
    too_big = raw_request(2, b"x" * 65)
    with pytest.raises(RemoteProtocolError):
        list(codec.BinaryDecoder(max_payload=64).feed_runs(a + a + too_big))


MESSAGES = st.one_of(
    st.just(codec.PING),
    st.builds(
        Request,
        st.integers(0, 0xFFFF),
        st.sampled_from([PUBLISH, PUBLISH + 1]),
        st.sampled_from([JSON, MSGPACK]),
        st.binary(max_size=20),
    ),
    st.builds(Request, st.integers(0, 0xFFFF), st.sampled_from([PUBLISH, 0])),
    st.builds(Notify, st.sampled_from([PUBLISH]), st.just(JSON), st.binary(max_size=5)),
    st.builds(Response, st.integers(0, 0xFFFF), st.just(0)),
)


@given(st.lists(MESSAGES, max_size=12), st.lists(st.integers(0, 400), max_size=6))
def test_runs_expand_to_the_same_messages_however_the_stream_is_cut(messages, cuts):
    stream = b"".join(codec.encode_binary(m) for m in messages)
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = codec.BinaryDecoder()
    out = []
    for lo, hi in zip([0, *points], [*points, len(stream)], strict=True):
        out.extend(decoder.feed_runs(stream[lo:hi]))
    assert all(m.count >= 2 for m in out if type(m) is RequestRun)
    assert codec.expand_runs(out) == messages


@given(st.binary(max_size=200))
def test_runs_fail_where_plain_decoding_fails(data):
    def decode(feed):
        out = []
        try:
            out.extend(feed(data))
        except RemoteProtocolError:
            return codec.expand_runs(out), "error"
        return codec.expand_runs(out), None

    assert decode(codec.BinaryDecoder(max_payload=50).feed_runs) == decode(
        codec.BinaryDecoder(max_payload=50).feed
    )


# -- run encodings of deliveries ---------------------------------------------------------------

TEXT = st.text(max_size=12)
DATA = st.one_of(
    st.binary(max_size=30),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30).map(
        str.encode
    ),
)


@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
@given(sender=TEXT, topic=TEXT.filter(bool), datas=st.lists(DATA, min_size=1, max_size=6))
@example(sender="p", topic="t", datas=[b"plain", b"", b"text"])  # JSON: all in one go
@example(sender="p", topic="t", datas=[b"plain", b'q"uote', b"\xff"])  # JSON: one by one
def test_run_encoding_equals_message_by_message(encoding, sender, topic, datas):
    encode = delivery_encoder("binary", encoding)
    run = MessageRun(Kind.MCAST, sender, "x", topic, len(datas), lambda: datas)
    one_by_one = b"".join(encode(Message(Kind.MCAST, sender, "x", topic, d)) for d in datas)
    assert encode.encode_run(run) == (one_by_one, len(datas))


PLAIN_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@given(sender=TEXT, topic=PLAIN_TEXT.filter(bool), datas=st.lists(PLAIN_TEXT, min_size=2))
def test_canonical_publishes_are_delivered_as_the_general_encoder_writes_them(sender, topic, datas):
    """The whole-run path applies exactly when every payload is canonical JSON to one topic
    ('"' and '\\' escaped by JSON are not: such runs take the per-request path)."""
    stream = b"".join(publish(i, topic, d) for i, d in enumerate(datas))
    (run,) = codec.BinaryDecoder().feed_runs(stream)
    encode = delivery_encoder("binary", JSON)
    want = b"".join(encode(Message(Kind.MCAST, sender, "stmp", topic, d.encode())) for d in datas)
    match = runs._CANONICAL_RUN.fullmatch(run.block)
    plain = not any(c in '"\\' for c in topic + "".join(datas))
    assert (match is not None) == plain
    if plain:
        bodies = runs._CUT.split(run.block)[2::2]
        assert runs._json_from_bodies(sender, bodies) == want
        assert runs._DATA.findall(run.block) == [d.encode() for d in datas]


def test_a_payload_hiding_a_request_is_not_taken_for_two():
    """A payload that holds a whole canonical request inside it is one (bad) request: the
    count check refuses the whole-run path and the general path answers 0x20."""
    inner = publish(7, "t", "b")
    hidden = raw_request(6, b'{"topic":"t","data":"a"}' + inner)
    assert runs._CANONICAL_RUN.fullmatch(publish(5, "t", "x") + hidden)
    broker = make_broker()
    sub, pub = subscriber(broker, "s", "t"), publisher(broker)
    pub.send(publish(5, "t", "x") + hidden)
    assert responses(pub) == [Response(5, Status.OK), Response(6, Status.BAD_REQUEST)]
    assert deliveries(sub) == [b"x"]


# -- the fast path against the general path ----------------------------------------------------


def login(ident: str, encoding: int = JSON) -> bytes:
    body = payloads.encode_payload({"id": ident, "scheme": "open"}, encoding)
    return codec.encode_binary(Request(1, payloads.LOGIN, encoding, body))


def subscribe(topic: str, encoding: int = JSON) -> bytes:
    body = payloads.encode_payload({"topic": topic}, encoding)
    return codec.encode_binary(Request(2, payloads.SUBSCRIBE, encoding, body))


def subscriber(broker, ident, topic, encoding=JSON):
    conn = connect(broker, "stmp")
    conn.send(login(ident, encoding))
    conn.send(subscribe(topic, encoding))
    conn.received()
    return conn


def publisher(broker, ident="p"):
    conn = connect(broker, "stmp")
    conn.send(login(ident))
    conn.received()
    return conn


def responses(conn):
    return list(codec.BinaryDecoder().feed(conn.received()))


def deliveries(conn, encoding=JSON):
    out = []
    for m in codec.BinaryDecoder().feed(conn.received()):
        fields = payloads.decode_payload(m.payload, encoding)
        out.append(payloads.data_from(fields, encoding))
    return out


def ssmp_subscriber(broker, ident, topic):
    conn = connect(broker, "ssmp")
    conn.send(f"LOGIN {ident} open x\nSUBSCRIBE {topic}\n".encode())
    conn.received()
    return conn


PUBLISH_PAYLOADS = st.one_of(
    # canonical JSON, to one of two topics
    st.builds(lambda t, d: ("json", {"topic": t, "data": d}), st.sampled_from("ab"), PLAIN_TEXT),
    # JSON that needs escapes, or is not compact, or carries base64
    st.builds(lambda t, d: ("json", {"topic": t, "data": d}), st.sampled_from("ab"), TEXT),
    st.builds(lambda t, d: ("spaced", {"topic": t, "data": d}), st.sampled_from("ab"), TEXT),
    st.builds(lambda t, d: ("indented", {"topic": t, "data": d}), st.sampled_from("ab"), TEXT),
    st.builds(
        lambda t, d: ("json", {"topic": t, **payloads.data_fields(d, JSON)}),
        st.sampled_from("ab"),
        st.binary(max_size=8),
    ),
    st.builds(lambda t, d: ("msgpack", {"topic": t, "data": d}), st.sampled_from("ab"), DATA),
    # what the general path refuses (0x20)
    st.sampled_from(
        [
            ("bytes", b"not json"),
            ("json", {"data": "no topic"}),
            ("json", {"topic": "", "data": "x"}),
            ("json", {"topic": "a"}),
            ("json", ["a", "list"]),
            ("msgpack", {"topic": 5, "data": b"x"}),
        ]
    ),
)


def encode_publish(ident: int, item) -> bytes:
    how, value = item
    if how == "bytes":
        return raw_request(ident, value)
    if how == "spaced":
        return raw_request(ident, json.dumps(value).encode())
    if how == "indented":
        return raw_request(ident, b"\r\n " + json.dumps(value, indent=2).encode() + b"\n")
    encoding = MSGPACK if how == "msgpack" else JSON
    return raw_request(ident, payloads.encode_payload(value, encoding), encoding)


def world(observe, plugins=()):
    """Subscribers of every kind, and a publisher; with ``observe``, a ``message_routed``
    observer (which makes the hub route a run message by message) records what it sees."""
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=plugins)
    seen = []
    if observe:
        broker.hub.observer = lambda message, result: seen.append(
            (message.sender, message.topic, message.payload, dict(result.recipients))
        )
    subs = [
        subscriber(broker, "ja", "a"),
        subscriber(broker, "jb", "b"),
        subscriber(broker, "ma", "a", MSGPACK),
        ssmp_subscriber(broker, "sa", "a"),
    ]
    pub = publisher(broker)
    pub.send(subscribe("a"))  # the publisher itself never gets its own publishes
    pub.received()
    return broker, seen, pub, subs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PUBLISH_PAYLOADS, min_size=2, max_size=10))
@example([("json", {"topic": "a", "data": f"m{i}"}) for i in range(3)])  # the whole-run path
@example([("msgpack", {"topic": "a", "data": b"\xff"})] * 2)
@example([("json", {"topic": t, "data": f"m{i}"}) for i, t in enumerate("abbab")])  # mixed
@example([("json", {"topic": t, "data": f"m{i}"}) for i, t in enumerate("ababa")])  # rotating
@pytest.mark.parametrize("observe", [False, True])
def test_pipelined_publishes_give_what_one_at_a_time_gives(observe, items):
    stream = [encode_publish(i, item) for i, item in enumerate(items, 1)]
    fast_broker, fast_seen, fast_pub, fast_subs = world(observe)
    fast_pub.send(b"".join(stream))  # one write: runs
    slow_broker, slow_seen, slow_pub, slow_subs = world(observe)
    for request in stream:
        slow_pub.send(request)  # one request per write: the general path
    assert fast_pub.received() == slow_pub.received()
    for fast, slow in zip(fast_subs, slow_subs, strict=True):
        assert fast.received() == slow.received()
    assert fast_seen == slow_seen
    assert fast_broker.hub.stats == slow_broker.hub.stats


class RefuseB:
    """An authorization hook that decides per topic (msgbroker.per_topic): no "b"."""

    def __init__(self):
        self.asked = 0

    @hookimpl
    @per_topic
    def msgbroker_authorize(self, session, action, topic):
        self.asked += 1
        return topic != "b"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PUBLISH_PAYLOADS, min_size=2, max_size=10))
@example([("json", {"topic": "b", "data": f"m{i}"}) for i in range(3)])  # a whole run refused
@example([("json", {"topic": t, "data": "x"}) for t in "aabba"])
def test_with_a_per_topic_hook_runs_give_what_one_at_a_time_gives(items):
    """The fast path asks a per-topic hook once per stretch to one topic, and hands the
    publishes it refuses to the general path: byte for byte the same answers."""
    stream = [encode_publish(i, item) for i, item in enumerate(items, 1)]
    fast_broker, _, fast_pub, fast_subs = world(False, [RefuseB()])
    fast_pub.send(b"".join(stream))
    slow_broker, _, slow_pub, slow_subs = world(False, [RefuseB()])
    for request in stream:
        slow_pub.send(request)
    assert fast_pub.received() == slow_pub.received()
    for fast, slow in zip(fast_subs, slow_subs, strict=True):
        assert fast.received() == slow.received()
    assert fast_broker.hub.stats == slow_broker.hub.stats


def test_a_per_topic_hook_is_asked_once_for_a_run():
    guard = RefuseB()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[guard])
    sub = subscriber(broker, "s", "a")
    pub = publisher(broker)
    asked = guard.asked
    pub.send(b"".join(publish(i, "a", f"m{i}") for i in range(1, 6)))
    assert responses(pub) == [Response(i, Status.OK) for i in range(1, 6)]
    assert deliveries(sub) == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert guard.asked - asked == 1


def test_a_run_of_canonical_publishes_reaches_every_protocol():
    broker = make_broker()
    ja, ma = subscriber(broker, "ja", "a"), subscriber(broker, "ma", "a", MSGPACK)
    sa = ssmp_subscriber(broker, "sa", "a")
    pub = publisher(broker)
    pub.send(b"".join(publish(i, "a", f"m{i}") for i in range(1, 5)))
    assert responses(pub) == [Response(i, Status.OK) for i in range(1, 5)]
    want = [b"m1", b"m2", b"m3", b"m4"]
    assert deliveries(ja) == want
    assert deliveries(ma, MSGPACK) == want
    assert sa.received() == b"".join(b"000 p MCAST a " + w + b"\n" for w in want)


class Deny:
    @hookimpl
    def msgbroker_authorize(self, session, action, topic):
        return topic != "secret"


def test_with_an_authorization_hook_each_publish_is_checked():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[Deny()])
    sub = subscriber(broker, "s", "ok")
    pub = publisher(broker)
    pub.send(publish(1, "ok", "a") + publish(2, "secret", "b") + publish(3, "ok", "c"))
    assert responses(pub) == [
        Response(1, Status.OK),
        Response(2, Status.FORBIDDEN),
        Response(3, Status.OK),
    ]
    assert deliveries(sub) == [b"a", b"c"]


def test_before_login_every_publish_of_a_run_is_unauthorized():
    conn = connect(make_broker(), "stmp")
    conn.send(publish(1, "t", "a") + publish(2, "t", "b"))
    assert responses(conn) == [Response(1, Status.UNAUTHORIZED), Response(2, Status.UNAUTHORIZED)]


def test_msgpack_runs_take_the_fast_path_too():
    broker = make_broker()
    sub = subscriber(broker, "s", "t", MSGPACK)
    pub = publisher(broker)
    pub.send(b"".join(publish(i, "t", f"m{i}", MSGPACK) for i in (1, 2, 3)))
    assert responses(pub) == [Response(i, Status.OK) for i in (1, 2, 3)]
    frames = list(codec.BinaryDecoder().feed(sub.received()))
    assert [msgpack.unpackb(m.payload)["data"] for m in frames] == [b"m1", b"m2", b"m3"]


@given(sender=TEXT, topic=TEXT.filter(bool), data=DATA)
def test_the_binary_json_delivery_encoder_writes_the_general_form(sender, topic, data):
    """The encoder fills a template for data that needs no escaping; the bytes must be what
    the general form (delivery_fields, JSON, notify 0.0.1.16) gives, for any data."""
    encode = delivery_encoder("binary", JSON)
    fields = payloads.delivery_fields(sender, "mcast", topic, data, JSON)
    general = codec.encode_binary(
        Notify(payloads.DELIVERY, JSON, payloads.encode_payload(fields, JSON))
    )
    assert encode(Message(Kind.MCAST, sender, "x", topic, data)) == general


def test_the_delivery_encoder_keeps_up_with_more_senders_and_topics_than_it_keeps():
    """Its sender and topic parts are each kept for the last 1,024: 1,100 of each (100 x 100
    scenario and more) still encode as the general form, across the clearing."""
    encode = delivery_encoder("binary", JSON)
    for i in range(1100):
        sender, topic = f"s{i}", f"t{(i * 7) % 1100}"
        fields = payloads.delivery_fields(sender, "mcast", topic, b"x", JSON)
        general = codec.encode_binary(
            Notify(payloads.DELIVERY, JSON, payloads.encode_payload(fields, JSON))
        )
        assert encode(Message(Kind.MCAST, sender, "x", topic, b"x")) == general
