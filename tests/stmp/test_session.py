"""The STMP server sessions alone, sans-IO (msgbroker.testing.drive): any split of a TCP
conversation gives the same bytes out, WebSocket messages are answered in the form they
came in, and the session's timers — login timeout, heartbeat, route timeout, login-failure
delay — run on a fake clock, ticked explicitly."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer

from msgbroker import BrokerConfig, hookimpl
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.codec import Encoding, Notify, Request, Response, Status
from msgbroker.plugins.stmp.encoders import text_frames
from msgbroker.plugins.stmp.payloads import decode_payload, encode_payload
from msgbroker.reasons import CloseReason
from msgbroker.testing import drive, make_broker

A = codec.parse_action
VECTORS = {
    v["name"]: v
    for v in json.loads((Path(__file__).parents[1] / "vectors" / "stmp.json").read_text())
}


def vector(name: str) -> bytes:
    return bytes.fromhex(VECTORS[name]["binary_hex"])


def req(ident: int, action: str, obj: object = None, encoding: int = Encoding.JSON) -> bytes:
    if obj is None:
        return codec.encode_binary(Request(ident, A(action)))
    return codec.encode_binary(Request(ident, A(action), encoding, encode_payload(obj, encoding)))


def decoded(data: bytes) -> list[codec.Message]:
    return list(codec.BinaryDecoder().feed(data))


def payload_of(message: codec.Message) -> object:
    return decode_payload(message.payload, message.encoding)  # type: ignore[union-attr]


class Routes:
    """A plugin route that answers only when the test fires it, within 5 s."""

    def __init__(self) -> None:
        self.pending: list[defer.Deferred[object]] = []

    @hookimpl
    def msgbroker_register_stmp_routes(self, router):
        router.add("10.3.0.0/16", self.later, timeout=5)

    def later(self, request):
        d: defer.Deferred[object] = defer.Deferred()
        self.pending.append(d)
        return d


# -- TCP: any split of a conversation ---------------------------------------------------------

#: a whole conversation of one client: the version check (the vector's bytes), login, a
#: subscribe, publishes pipelined (a run, after login), a unicast to itself, a ping, a notify
#: to nowhere, an unknown action, and a bad payload
CONVERSATION = (
    vector("version_check_request")
    + req(1, "0.0.1.1", {"id": "alice", "scheme": "open"})
    + req(2, "0.0.1.2", {"topic": "news"})
    + req(3, "0.0.1.4", {"topic": "feed", "data": "one"})
    + req(4, "0.0.1.4", {"topic": "feed", "data": "two"})
    + req(5, "0.0.1.4", {"topic": "feed", "data_b64": "//4="})
    + req(6, "0.0.1.5", {"to": "alice", "data": "to myself"})
    + vector("ping")
    + codec.encode_binary(Notify(A("10.9.9.9"), Encoding.JSON, b"{}"))
    + req(7, "9.9.9.9", {})
    + codec.encode_binary(Request(8, A("0.0.1.4"), Encoding.JSON, b"{not json"))
)


def converse(sizes: tuple[int, ...] | None) -> tuple[bytes, bytes]:
    """(what alice received, what a subscriber of ``feed`` received) for one split."""
    broker = make_broker()
    reader = drive(broker, "stmp")
    reader.feed(req(1, "0.0.1.1", {"id": "reader", "scheme": "open"}))
    reader.feed(req(2, "0.0.1.2", {"topic": "feed"}))
    reader.received()
    alice = drive(broker, "stmp")
    if sizes is None:
        alice.feed(CONVERSATION)
    else:
        alice.feed_split(CONVERSATION, sizes)
    return alice.received(), reader.received()


def test_the_whole_conversation_at_once():
    said, delivered = converse(None)
    replies = decoded(said)
    assert replies[0] == Response(0, Status.OK, Encoding.RAW, b"\x01")
    assert said.startswith(vector("version_check_reply_ok"))
    assert [(r.id, r.status) for r in replies[1:] if type(r) is Response] == [
        (1, Status.OK),
        (2, Status.OK),
        (3, Status.OK),
        (4, Status.OK),
        (5, Status.OK),
        (6, Status.OK),
        (7, Status.NOT_FOUND),
        (8, Status.BAD_REQUEST),
    ]
    (to_myself,) = [m for m in replies if type(m) is Notify]
    assert payload_of(to_myself) == {"from": "alice", "kind": "ucast", "data": "to myself"}
    fields = {"from": "alice", "kind": "mcast", "topic": "feed"}
    assert [payload_of(m) for m in decoded(delivered)] == [
        {**fields, "data": "one"},
        {**fields, "data": "two"},
        {**fields, "data_b64": "//4="},  # not UTF-8: base64 in JSON
    ]


@cache
def whole() -> tuple[bytes, bytes]:
    return converse(None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=60))
def test_any_split_of_the_input_gives_the_same_bytes_to_everyone(sizes):
    # after the login, what arrives in one chunk is read as runs (the publish fast path);
    # the whole conversation in one chunk is read message by message: both say the same
    assert converse(tuple(sizes)) == whole()


WRONG = {"id": "mallory", "scheme": "kerberos"}
HELD = (
    req(1, "0.0.1.1", WRONG)
    + vector("version_check_request")
    + req(2, "0.0.1.1", {"id": "alice", "scheme": "open"})
    + req(3, "0.0.1.2", {"topic": "t"})
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 30), max_size=20))
def test_what_follows_a_refused_login_waits_for_it_whatever_the_split(sizes):
    broker = make_broker(BrokerConfig(auth=("open",), login_failure_delay=1.0))
    driver = drive(broker, "stmp")
    driver.feed_split(HELD, sizes)
    assert driver.received() == b""
    assert driver.reading_paused
    driver.advance(1.0)
    assert [(r.id, r.status) for r in decoded(driver.received())] == [  # type: ignore[union-attr]
        (1, Status.UNAUTHORIZED),
        (0, Status.OK),
        (2, Status.OK),
        (3, Status.OK),
    ]
    assert not driver.reading_paused
    assert driver.session.identity == "alice"


# -- the timers, on a fake clock ----------------------------------------------------------------


def test_no_login_within_the_login_timeout_closes_without_a_word():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=5))
    driver = drive(broker, "stmp")
    driver.feed(vector("version_check_request"))
    assert driver.received() == vector("version_check_reply_ok")
    driver.advance(4.9)
    assert not driver.closed
    driver.advance(0.1)
    assert driver.closed_by == "close"  # flushed, not aborted
    assert driver.received() == b""
    assert driver.session.close_reason is CloseReason.LOGIN_TIMEOUT


def test_a_login_stops_the_login_timer():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=5, keepalive=30))
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}))
    driver.advance(10)
    assert not driver.closed


def test_the_heartbeat_pings_on_a_fixed_cadence_whatever_the_traffic():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}))
    driver.received()
    for _ in range(4):
        driver.advance(15)
        driver.feed(vector("ping"))  # busy: a ping from the client every 15 s
        driver.advance(15)
        assert driver.received() == b"\x00"  # the server's own ping, every 30 s
    assert not driver.closed


def test_the_heartbeat_closes_two_intervals_after_the_last_byte():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}))
    driver.advance(40)
    driver.feed(vector("ping"))  # the last byte, at 40
    driver.advance(59.9)
    assert not driver.closed
    driver.advance(0.1)  # 100 = 40 + 2 x 30, not the next ping (120)
    assert driver.closed
    assert driver.session.close_reason is CloseReason.KEEPALIVE_TIMEOUT


def test_the_heartbeat_runs_from_the_open_not_from_the_login():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=100, keepalive=10))
    driver = drive(broker, "stmp")
    driver.advance(10)
    assert driver.received() == b"\x00"  # pinged before any login
    driver.advance(10)
    assert driver.session.close_reason is CloseReason.KEEPALIVE_TIMEOUT


def test_silence_while_the_broker_holds_the_input_is_no_timeout():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}))
    driver.session.hold_reading("flood control")
    driver.advance(300)
    assert not driver.closed
    driver.session.release_reading("flood control")
    driver.advance(60)
    assert driver.session.close_reason is CloseReason.KEEPALIVE_TIMEOUT


def test_a_route_that_does_not_answer_in_time_gets_0x34_and_its_late_answer_is_dropped():
    routes = Routes()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[routes])
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}) + req(2, "10.3.0.1", {}))
    assert decoded(driver.received()) == [Response(1, Status.OK)]
    driver.advance(4.9)
    assert driver.received() == b""
    driver.advance(0.1)
    assert decoded(driver.received()) == [Response(2, Status.GATEWAY_TIMEOUT)]
    (late,) = routes.pending
    assert late.called  # cancelled, so the handler can stop working
    driver.feed(req(3, "10.3.0.2", {}))
    routes.pending[1].callback({"n": 1})
    (answer,) = decoded(driver.received())
    assert (answer.id, answer.status, payload_of(answer)) == (3, Status.OK, {"n": 1})


def test_a_connection_lost_with_a_route_pending_answers_nothing():
    routes = Routes()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[routes])
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}) + req(2, "10.3.0.1", {}))
    driver.received()
    driver.lose()
    assert routes.pending[0].called
    assert driver.received() == b""


@pytest.mark.parametrize("delay", [0.5, 2.0])
def test_a_refused_login_is_answered_after_the_failure_delay(delay):
    broker = make_broker(BrokerConfig(auth=("open",), login_failure_delay=delay))
    driver = drive(broker, "stmp")
    driver.feed(req(7, "0.0.1.1", WRONG))
    driver.advance(delay * 0.99)
    assert driver.received() == b""
    driver.advance(delay * 0.02)
    (reply,) = decoded(driver.received())
    assert (reply.id, reply.status, payload_of(reply)) == (7, 0x21, {"schemes": ["open"]})
    assert not driver.closed  # and it may try again


def test_the_login_timeout_closes_a_connection_held_by_a_refused_login():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=1, login_failure_delay=2))
    driver = drive(broker, "stmp")
    driver.feed(req(1, "0.0.1.1", WRONG) + req(2, "0.0.1.1", {"id": "a", "scheme": "open"}))
    driver.advance(1)
    assert driver.session.close_reason is CloseReason.LOGIN_TIMEOUT
    assert driver.received() == b""


# -- WebSocket messages ---------------------------------------------------------------------------


def ws_session(**config):
    broker = make_broker(BrokerConfig(auth=("open",), **config))
    driver = drive(broker, "stmp-ws")
    driver.server.websocket_opened()
    return driver


def ws(driver, payload: bytes, binary: bool = False) -> None:
    driver.feed_to(driver.server.message_received, payload, binary)


def test_websocket_messages_are_answered_in_their_own_form():
    driver = ws_session()
    ws(driver, VECTORS["version_check_request"]["text"].encode())
    assert driver.received() == text_frames(Response(0, Status.OK, Encoding.RAW, b"01"), True)
    login = encode_payload({"id": "alice", "scheme": "open"}, Encoding.JSON)
    ws(driver, b"1|2|1|257|" + login)
    assert driver.received() == text_frames(Response(1, Status.OK))
    # a binary frame: one message without PS, answered as a binary frame
    ws(driver, codec.encode_binary(Request(2, A("9.9.9.9")), with_ps=False), binary=True)
    assert driver.received() == b"\x82\x04" + codec.encode_binary(Response(2, Status.NOT_FOUND))
    # a text header, then its msgpack payload in a binary frame: answered in text
    subscribe = encode_payload({"topic": "t"}, Encoding.MSGPACK)
    ws(driver, b"1|3|3|258")
    assert driver.received() == b""
    ws(driver, subscribe, binary=True)
    assert driver.received() == text_frames(Response(3, Status.OK))


def test_a_websocket_protocol_error_closes_with_its_detail():
    driver = ws_session()
    ws(driver, b"1|9|1|257")
    assert driver.session.close_reason is CloseReason.PROTOCOL_ERROR
    assert driver.session.close_text == "protocol error: unknown encoding 9"


def test_the_websocket_heartbeat_starts_at_the_open_in_text_frames():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=100, keepalive=10))
    driver = drive(broker, "stmp-ws")
    driver.advance(15)  # the handshake is not done: no STMP ping yet
    assert driver.received() == b""
    driver.server.websocket_opened()
    driver.advance(10)
    assert driver.received() == text_frames(codec.PING)
