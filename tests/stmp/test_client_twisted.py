"""The Twisted client's protocol (:class:`STMPClientProtocol`) on a ``Clock`` and a
``StringTransport`` (:class:`~tests.stmp.client_support.Wire`), no sockets: the version check,
request ids and their wrap, local timeouts and late replies, the heartbeat, deliveries and
other notifies, the broker actions' payloads, and what garbage, connection loss and ``close()``
do to pending requests. The same client over real sockets is in
``test_client_twisted_network.py``.
"""

from __future__ import annotations

import msgpack
import pytest

from msgbroker.clientkit.testing import result
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.client import Delivery, STMPConnectionClosed, STMPError
from msgbroker.plugins.stmp.client_common import RequestIds
from msgbroker.plugins.stmp.codec import PING, Encoding, Notify, Request, Response, Status
from tests.stmp.client_support import (
    ECHO,
    JSON,
    MSGPACK,
    NOTIFY_BACK,
    RAW,
    SILENT,
    Wire,
)


def test_the_version_check_is_sent_first_and_ready_fires_with_the_version():
    wire = Wire()
    ready = wire.proto.when_ready()
    assert wire.sent() == [Request(0, 0, RAW, b"\x01")]  # id 0, action 0, raw, [0.1]
    assert not ready.called
    wire.feed(Response(0, Status.OK, RAW, b"\x01"))
    assert result(ready) == (0, 1)
    assert wire.proto.stmp_version == (0, 1)
    assert result(wire.proto.when_ready()) == (0, 1)


def test_requests_made_before_the_version_reply_are_pipelined_after_the_check():
    wire = Wire()
    d = wire.proto.request(ECHO, {"a": 1})
    sent = wire.sent()
    assert [type(m) for m in sent] == [Request, Request]
    assert sent[0].action == 0 and sent[1] == Request(1, ECHO, JSON, b'{"a":1}')
    wire.feed(Response(0, Status.OK, RAW, b"\x01"), Response(1, Status.OK, JSON, b"[]"))
    assert result(d) == Response(1, Status.OK, JSON, b"[]")


def test_version_not_supported_fails_ready_with_0x35_and_closes():
    wire = Wire()
    pending = wire.proto.request(ECHO, None)
    wire.feed(Response(0, Status.VERSION_NOT_SUPPORTED))
    with pytest.raises(STMPError) as info:
        result(wire.proto.when_ready())
    assert info.value.status == 0x35
    assert "VersionNotSupported" in str(info.value)
    assert wire.closed
    with pytest.raises(STMPConnectionClosed):
        result(pending)


def test_an_ok_with_a_version_not_offered_closes_the_connection():
    wire = Wire()
    wire.feed(Response(0, Status.OK, RAW, b"\x20"))  # 2.0
    with pytest.raises(RemoteProtocolError):
        result(wire.proto.when_ready())
    assert wire.closed


def test_an_unanswered_version_check_times_out_locally_with_0x25():
    wire = Wire(timeout=5)
    ready = wire.proto.when_ready()
    wire.clock.advance(5)
    with pytest.raises(STMPError) as info:
        result(ready)
    assert info.value.status == 0x25 and info.value.local
    assert wire.closed


def test_request_ids_count_from_1_and_replies_match_by_id_in_any_order():
    wire = Wire()
    wire.ready()
    first, second, third = (wire.proto.request(ECHO, n) for n in (1, 2, 3))
    assert [m.id for m in wire.sent()] == [1, 2, 3]
    wire.feed(
        Response(3, Status.OK, JSON, b"3"),
        Response(1, Status.OK, JSON, b"1"),
        Response(2, Status.NOT_FOUND),
    )
    assert result(first).payload == b"1"
    assert result(second) == Response(2, Status.NOT_FOUND)  # a status is not an error here
    assert result(third).payload == b"3"


def test_request_ids_wrap_from_65535_to_1_and_skip_ids_still_pending():
    wire = Wire()
    wire.ready()
    pending = wire.proto.request(SILENT, None)  # id 1, never answered yet
    wire.proto.session.ids._next = 65534
    for _ in range(3):
        wire.proto.request(ECHO, None)
    assert [m.id for m in wire.sent()] == [1, 65534, 65535, 2]  # not 0, not 1 (pending)
    assert not pending.called


def test_the_id_allocator_alone():
    ids = RequestIds()
    assert [ids.take(()) for _ in range(3)] == [1, 2, 3]
    ids._next = 65535
    assert ids.take({1, 2}) == 65535
    assert ids.take({1, 2}) == 3
    with pytest.raises(STMPError) as info:
        ids.take(range(1, 65536))
    assert info.value.status == Status.TOO_MANY_REQUESTS


def test_a_request_without_reply_fires_with_a_local_0x25_and_the_late_reply_is_dropped():
    wire = Wire(timeout=10)
    wire.ready()
    d = wire.proto.request(SILENT, {"x": 1}, timeout=2)
    [sent] = wire.sent()
    wire.clock.advance(1.9)
    assert not d.called
    wire.clock.advance(0.1)
    assert result(d) == Response(sent.id, Status.REQUEST_TIMEOUT)
    wire.feed(Response(sent.id, Status.OK, JSON, b'"late"'))  # no error, no effect
    assert wire.proto.late_replies == 1
    assert not wire.closed


def test_call_reports_a_timeout_as_a_local_stmp_error():
    wire = Wire(timeout=3)
    wire.ready()
    d = wire.proto.call(SILENT)
    wire.clock.advance(3)
    with pytest.raises(STMPError) as info:
        result(d)
    assert info.value.status == 0x25 and info.value.local
    assert "no reply in time" in str(info.value)


def test_a_server_sent_0x25_is_not_local():
    wire = Wire()
    wire.ready()
    d = wire.proto.call(ECHO)
    wire.feed(Response(1, Status.REQUEST_TIMEOUT))
    with pytest.raises(STMPError) as info:
        result(d)
    assert info.value.status == 0x25 and not info.value.local


def test_a_timed_out_id_is_not_reused_before_its_late_reply_came():
    wire = Wire()
    wire.ready()
    wire.proto.request(SILENT, timeout=1)
    wire.clock.advance(1)
    wire.proto.session.ids._next = 1  # as after a wrap
    wire.proto.request(ECHO)
    assert [m.id for m in wire.sent()] == [1, 2]  # 2, not the timed-out 1
    wire.feed(Response(1, Status.OK))  # the late reply: dropped, and 1 is free again
    wire.proto.session.ids._next = 1
    wire.proto.request(ECHO)
    assert [m.id for m in wire.sent()] == [1]


def test_a_reply_to_no_request_is_ignored():
    wire = Wire()
    wire.ready()
    wire.feed(Response(77, Status.OK))
    assert not wire.closed and wire.proto.late_replies == 0


def test_heartbeat_pings_every_interval_and_closes_after_two_silent_intervals():
    wire = Wire(heartbeat=30)
    wire.ready()
    wire.clock.advance(29)
    assert wire.sent() == []
    wire.clock.advance(1)
    assert wire.sent() == [PING]
    wire.clock.advance(20)
    wire.feed(PING)  # the server's heartbeat at t=50 keeps us alive
    assert wire.proto.pings_received == 1
    wire.clock.advance(10)
    assert wire.sent() == [PING]  # t=60
    wire.clock.advance(30)
    assert wire.sent() == [PING]  # t=90: 40 s of silence so far
    assert not wire.closed
    ready_to_fail = wire.proto.request(SILENT, timeout=100)
    wire.clock.advance(20)  # t=110: 60 s since the server's ping
    assert wire.closed
    wire.lose()
    with pytest.raises(STMPConnectionClosed, match="nothing from the server for 60 s"):
        result(ready_to_fail)


def test_heartbeat_off():
    wire = Wire(heartbeat=None)
    wire.ready()
    wire.clock.advance(1000)
    assert wire.sent() == [] and not wire.closed


@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_deliveries_go_to_on_delivery_and_other_notifies_to_on_notify(encoding):
    deliveries, notifies = [], []
    wire = Wire(on_delivery=deliveries.append, on_notify=notifies.append)
    wire.ready()

    def notify(sender, kind, topic, data):
        fields = payloads.delivery_fields(sender, kind, topic, data, encoding)
        return Notify(payloads.DELIVERY, encoding, payloads.encode_payload(fields, encoding))

    wire.feed(
        notify("alice", "mcast", "news", b"a|b"),
        notify("bob", "ucast", None, b"\xff\x00"),
        notify("carol", "bcast", None, b""),
        notify("dave", "subscribe", "news", None),
        Notify(payloads.DELIVERY, JSON, b"{not json"),  # malformed: dropped
        Notify(payloads.DELIVERY, JSON, b'{"from": "x", "kind": "zap"}'),  # dropped
        Notify(NOTIFY_BACK, RAW, b"plugin"),
    )
    assert deliveries == [
        Delivery("alice", "mcast", "news", b"a|b"),
        Delivery("bob", "ucast", None, b"\xff\x00"),
        Delivery("carol", "bcast", None, b""),
        Delivery("dave", "subscribe", "news", b""),
    ]
    assert notifies == [Notify(NOTIFY_BACK, RAW, b"plugin")]
    assert not wire.closed


def test_a_failing_event_handler_is_logged_not_fatal():
    def boom(delivery):
        raise RuntimeError("handler bug")

    wire = Wire(on_delivery=boom)
    wire.ready()
    fields = payloads.delivery_fields("a", "bcast", None, b"x", JSON)
    wire.feed(Notify(payloads.DELIVERY, JSON, payloads.encode_payload(fields, JSON)))
    d = wire.proto.request(ECHO)
    wire.feed(Response(1, Status.OK))
    assert result(d).status == 0
    assert not wire.closed


@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_broker_actions_send_the_decisions_payloads(encoding):
    wire = Wire(encoding=encoding)
    wire.ready()
    wire.proto.login("alice", "secret", b"pw")
    wire.proto.subscribe("news", presence=True)
    wire.proto.unsubscribe("news")
    wire.proto.publish("news", b"text | pipe")
    wire.proto.unicast("bob", b"\xff\xfe")
    wire.proto.broadcast(b"all")
    sent = wire.sent()
    assert [codec_action(m) for m in sent] == [f"0.0.1.{n}" for n in (1, 2, 3, 4, 5, 6)]
    assert all(m.encoding == encoding for m in sent)
    values = [payloads.decode_payload(m.payload, encoding) for m in sent]
    binary = {"data_b64": "//4="} if encoding == JSON else {"data": b"\xff\xfe"}
    text = (lambda s: s) if encoding == JSON else (lambda s: s.encode())
    assert values == [
        {"id": "alice", "scheme": "secret", "credential": "pw"},
        {"topic": "news", "presence": True},
        {"topic": "news"},
        {"topic": "news", "data": text("text | pipe")},
        {"to": "bob", **binary},
        {"data": text("all")},
    ]


def codec_action(message: Request) -> str:
    from msgbroker.plugins.stmp.codec import action_to_str

    return action_to_str(message.action)


def test_broker_actions_fire_with_none_on_ok_and_fail_with_the_status_and_payload():
    wire = Wire()
    wire.ready()
    login = wire.proto.login("alice", "open")
    sub = wire.proto.subscribe("t")
    wire.feed(
        Response(1, Status.UNAUTHORIZED, JSON, b'{"schemes":["secret"]}'),
        Response(2, Status.OK),
    )
    with pytest.raises(STMPError) as info:
        result(login)
    assert info.value.status == 0x21
    assert info.value.payload == {"schemes": ["secret"]}
    assert str(info.value) == '0x21 Unauthorized: {"schemes": ["secret"]}'
    assert wire.proto.identity is None
    assert result(sub) is None


def test_request_payload_forms():
    wire = Wire(encoding=MSGPACK)
    wire.ready()
    wire.proto.request("10.0.0.1")  # no payload: encoding 0
    wire.proto.request("10.0.0.1", b"\x00raw")  # bytes: raw
    wire.proto.request("10.0.0.1", b"\x08\x01", encoding=Encoding.PROTOBUF)
    wire.proto.request(0x0A000001, {"k": b"v"})  # a value: the protocol's encoding
    wire.proto.request("10.0.0.1", ["x"], encoding=JSON)
    assert wire.sent() == [
        Request(1, 0x0A000001, Encoding.NONE, b""),
        Request(2, 0x0A000001, RAW, b"\x00raw"),
        Request(3, 0x0A000001, Encoding.PROTOBUF, b"\x08\x01"),
        Request(4, 0x0A000001, MSGPACK, msgpack.packb({"k": b"v"})),
        Request(5, 0x0A000001, JSON, b'["x"]'),
    ]
    with pytest.raises(ValueError):
        wire.proto.request("10.0.0", None)
    with pytest.raises(ValueError):
        wire.proto.request("10.0.0.1", {"bytes": b"x"}, encoding=JSON)
    assert wire.sent() == []


def test_a_request_from_the_server_is_answered_not_found():
    wire = Wire()
    wire.ready()
    wire.feed(Request(9, ECHO, JSON, b"{}"))
    assert wire.sent() == [Response(9, Status.NOT_FOUND)]


def test_garbage_from_the_server_closes_and_fails_what_is_pending():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(ECHO)
    wire.proto.dataReceived(b"\x07")  # reserved header bits
    assert wire.closed
    with pytest.raises(STMPConnectionClosed, match="protocol error"):
        result(d)


def test_connection_loss_fails_pending_requests_and_fires_when_closed():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(ECHO)
    closed = wire.proto.when_closed()
    wire.lose()
    with pytest.raises(STMPConnectionClosed):
        result(d)
    assert isinstance(result(closed), STMPConnectionClosed)
    with pytest.raises(STMPConnectionClosed):
        result(wire.proto.request(ECHO))
    assert wire.clock.getDelayedCalls() == []  # heartbeat and request timers cancelled


def test_close_fails_pending_requests_and_stops_the_timers():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(SILENT)
    closing = wire.proto.close()
    assert wire.closed and not closing.called
    with pytest.raises(STMPConnectionClosed):
        result(wire.proto.request(ECHO))
    wire.lose()
    assert result(closing) is None
    with pytest.raises(STMPConnectionClosed, match="closed by the client"):
        result(d)
    assert wire.clock.getDelayedCalls() == []


def test_a_login_answered_with_another_identity_takes_that_identity():
    wire = Wire()
    wire.ready()
    login = wire.proto.login("alice", "open")
    wire.feed(Response(1, Status.OK, JSON, b'{"id":"ALICE"}'))
    assert result(login) is None
    assert wire.proto.identity == "ALICE"
