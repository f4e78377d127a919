"""STMP server behaviour over TCP (binary), in memory: the rules of docs/stmp.md, "Decisions"."""

from __future__ import annotations

import pytest
from twisted.internet import defer

from msgbroker import BrokerConfig, ConfigError, hookimpl
from msgbroker.auth import Accept
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.codec import Encoding, Notify, Request, Response, Status
from msgbroker.plugins.stmp.payloads import decode_payload, encode_payload
from msgbroker.plugins.stmp.router import Reply, STMPStatusError
from msgbroker.testing import connect, make_broker

A = codec.parse_action


def req(ident, action, obj=None, encoding=Encoding.JSON):
    if obj is None:
        return codec.encode_binary(Request(ident, A(action)))
    return codec.encode_binary(Request(ident, A(action), encoding, encode_payload(obj, encoding)))


VERSION_CHECK = codec.encode_binary(Request(0, 0, Encoding.RAW, b"\x01"))


def messages(conn):
    return list(codec.BinaryDecoder().feed(conn.received()))


def decoded(message):
    return decode_payload(message.payload, message.encoding)


@pytest.fixture
def broker():
    return make_broker(BrokerConfig(auth=("open",)))


def login(broker, identity="alice", encoding=Encoding.JSON):
    conn = connect(broker, "stmp")
    conn.send(VERSION_CHECK + req(1, "0.0.1.1", {"id": identity, "scheme": "open"}, encoding))
    assert messages(conn) == [
        Response(0, Status.OK, Encoding.RAW, b"\x01"),
        Response(1, Status.OK),
    ]
    return conn


def test_version_check_chooses_0_1():
    conn = connect(make_broker(), "stmp")
    conn.send(codec.encode_binary(Request(0, 0, Encoding.RAW, b"\x02\x01\x10")))
    assert messages(conn) == [Response(0, Status.OK, Encoding.RAW, b"\x01")]
    assert not conn.closed


@pytest.mark.parametrize("payload", [b"\x02", b"", b"\x10\x11"])
def test_unsupported_versions_get_0x35_and_close(payload):
    conn = connect(make_broker(), "stmp")
    conn.send(codec.encode_binary(Request(0, 0, Encoding.RAW, payload)))
    assert messages(conn) == [Response(0, Status.VERSION_NOT_SUPPORTED)]
    assert conn.closed


def test_skipping_the_version_check_is_treated_as_0_1(broker):
    conn = connect(broker, "stmp")
    conn.send(req(9, "0.0.1.1", {"id": "x", "scheme": "open"}))
    assert messages(conn) == [Response(9, Status.OK)]


def test_before_login_only_version_check_and_login(broker):
    conn = connect(broker, "stmp")
    conn.send(req(1, "0.0.1.2", {"topic": "t"}) + req(2, "10.0.0.1", {}))
    assert messages(conn) == [Response(1, Status.UNAUTHORIZED), Response(2, Status.UNAUTHORIZED)]


def test_login_refused_lists_schemes_and_ids_are_echoed():
    broker = make_broker(BrokerConfig(auth=("open", "secret"), secret_file=__file__))
    conn = connect(broker, "stmp")
    conn.send(req(0x1234, "0.0.1.1", {"id": "a", "scheme": "kerberos"}))
    broker.reactor.advance(broker.config.login_failure_delay)  # a refusal is answered late
    (reply,) = messages(conn)
    assert (reply.id, reply.status) == (0x1234, Status.UNAUTHORIZED)
    assert decoded(reply) == {"schemes": ["open", "secret"]}
    assert not conn.closed


def test_requests_take_effect_in_order_within_one_write(broker):
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open\n")
    conn = connect(broker, "stmp")
    conn.send(
        req(1, "0.0.1.1", {"id": "a", "scheme": "open"})
        + req(2, "0.0.1.2", {"topic": "t"})
        + req(3, "0.0.1.2", {"topic": "t"})  # already subscribed is Ok
    )
    assert [m.status for m in messages(conn)] == [0, 0, 0]
    ssmp.received()
    ssmp.send(b"MCAST t hi\n")
    (delivery,) = messages(conn)
    assert delivery.action == A("0.0.1.16")
    assert decoded(delivery) == {"from": "s", "kind": "mcast", "topic": "t", "data": "hi"}


def test_publish_unicast_broadcast_and_presence_between_stmp_clients(broker):
    a, b = login(broker, "a"), login(broker, "b", Encoding.MSGPACK)
    b.send(req(2, "0.0.1.2", {"topic": "t", "presence": True}, Encoding.MSGPACK))
    assert [m.status for m in messages(b)] == [0]
    a.send(req(2, "0.0.1.2", {"topic": "t"}))
    a.received()
    (joined,) = messages(b)
    assert decoded(joined) == {"from": "a", "kind": "subscribe", "topic": "t"}
    a.send(
        req(3, "0.0.1.4", {"topic": "t", "data_b64": "AAEC/w=="})
        + req(4, "0.0.1.5", {"to": "b", "data": "direct"})
        + req(5, "0.0.1.6", {"data": "all"})
        + req(6, "0.0.1.5", {"to": "nobody", "data": "x"})
    )
    assert [m.status for m in messages(a)] == [0, 0, 0, Status.NOT_FOUND]
    got = [decoded(m) for m in messages(b)]
    assert got == [
        {"from": "a", "kind": "mcast", "topic": "t", "data": b"\x00\x01\x02\xff"},
        {"from": "a", "kind": "ucast", "data": b"direct"},
        {"from": "a", "kind": "bcast", "data": b"all"},
    ]


def test_json_delivery_of_binary_data_uses_data_b64(broker):
    ssmp = connect(broker, "ssmp")
    ssmp.send(b"LOGIN s open\n")
    a = login(broker, "a")
    a.send(req(2, "0.0.1.2", {"topic": "t"}))
    a.received()
    ssmp.send(b"MCAST t \x00\x01\xff\xfe\n")
    (delivery,) = messages(a)
    assert decoded(delivery)["data_b64"] == "//4="


def test_unsubscribe_unknown_is_not_found_and_bad_payloads_are_bad_requests(broker):
    a = login(broker)
    a.send(
        req(2, "0.0.1.3", {"topic": "never"})
        + req(3, "0.0.1.2", {"no": "topic"})
        + codec.encode_binary(Request(4, A("0.0.1.4"), Encoding.JSON, b"{not json"))
        + req(5, "0.0.1.4", {"topic": "t", "data_b64": "***"})
    )
    assert [m.status for m in messages(a)] == [
        Status.NOT_FOUND,
        Status.BAD_REQUEST,
        Status.BAD_REQUEST,
        Status.BAD_REQUEST,
    ]


def test_unknown_and_reserved_actions_are_not_found(broker):
    a = login(broker)
    a.send(req(2, "9.9.9.9", {}) + req(3, "0.0.0.7", {}))
    assert [(m.id, m.status) for m in messages(a)] == [(2, Status.NOT_FOUND), (3, Status.NOT_FOUND)]


class Routes:
    """A plugin with routes of every shape."""

    def __init__(self):
        self.pending = defer.Deferred()
        self.seen = []

    @hookimpl
    def msgbroker_register_stmp_routes(self, router):
        router.add("10.0.0.0/8", self.wide)
        router.add("10.1.0.0/16", self.narrow)
        router.add("10.1.2.3", self.echo)
        router.add("10.2.0.0/16", self.fails)
        router.add("10.3.0.0/16", self.slow, timeout=5)
        router.add("10.4.0.0/16", self.coroutine)
        router.add("10.5.0.0/16", self.teapot)

    def wide(self, request):
        return {"route": "wide", "action": request.action_text}

    def narrow(self, request):
        return {"route": "narrow", "me": request.session.identity}

    def echo(self, request):
        self.seen.append(request)
        return request.payload

    def fails(self, request):
        raise RuntimeError("secret internals")

    def slow(self, request):
        return self.pending

    async def coroutine(self, request):
        return Reply(0x80, {"custom": True})

    def teapot(self, request):
        raise STMPStatusError(Status.FORBIDDEN, {"why": "no"})


def test_plugin_routes_longest_prefix_values_errors_and_coroutines():
    routes = Routes()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[routes])
    a = login(broker, "me")
    a.send(
        req(1, "10.9.9.9", {})
        + req(2, "10.1.9.9", {})
        + req(3, "10.1.2.3", [1, "two"], Encoding.MSGPACK)
        + req(4, "10.2.0.1", {})
        + req(5, "10.4.0.1", {})
        + req(6, "10.5.0.1", {})
    )
    replies = messages(a)
    assert [(m.id, m.status) for m in replies] == [
        (1, 0),
        (2, 0),
        (3, 0),
        (4, Status.INTERNAL_SERVER_ERROR),
        (5, 0x80),
        (6, Status.FORBIDDEN),
    ]
    assert decoded(replies[0]) == {"route": "wide", "action": "10.9.9.9"}
    assert decoded(replies[1]) == {"route": "narrow", "me": "me"}
    assert replies[2].encoding == Encoding.MSGPACK and decoded(replies[2]) == [1, "two"]
    assert replies[3].payload == b""  # nothing of the exception leaks
    assert decoded(replies[4]) == {"custom": True}
    assert decoded(replies[5]) == {"why": "no"}
    assert routes.seen[0].session.identity == "me"


def test_handler_that_does_not_answer_in_time_gets_0x34_and_late_reply_is_dropped():
    routes = Routes()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[routes])
    a = login(broker)
    a.send(req(7, "10.3.0.1", {}))
    assert messages(a) == []
    broker.reactor.advance(5.1)
    assert messages(a) == [Response(7, Status.GATEWAY_TIMEOUT)]
    assert routes.pending.called  # cancelled, so the handler can stop working
    a.send(req(8, "10.9.0.0", {}))
    assert [m.id for m in messages(a)] == [8]


def test_reserved_range_cannot_be_routed_by_plugins():
    class Bad:
        @hookimpl
        def msgbroker_register_stmp_routes(self, router):
            router.add("0.0.0.5", lambda r: None)

    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[Bad()])
    with pytest.raises(ConfigError, match=r"bad STMP route: 0\.0\.0\.5 is in 0\.0\.0\.0/24"):
        connect(broker, "stmp")


def test_heartbeat_pings_every_interval_and_closes_after_two_silent_intervals(broker):
    a = login(broker)
    broker.reactor.advance(30)
    assert messages(a) == [codec.PING]
    a.send(b"\x00")
    broker.reactor.advance(30)
    assert messages(a) == [codec.PING]
    assert not a.closed
    broker.reactor.advance(30)
    assert a.closed
    assert a.session.close_reason == "keepalive timeout"


def test_heartbeat_never_closes_a_connection_whose_input_the_broker_holds(broker):
    a = login(broker)
    a.session.hold_reading("flood control")  # e.g. an sbus client blocking its publisher
    broker.reactor.advance(300)
    assert not a.closed
    a.session.release_reading("flood control")
    broker.reactor.advance(60)  # silent again, and nobody holds it: closed
    assert a.closed and a.session.close_reason == "keepalive timeout"


def test_login_timeout_closes_without_a_reply():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=3))
    conn = connect(broker, "stmp")
    conn.send(VERSION_CHECK)
    conn.received()
    broker.reactor.advance(3.1)
    assert conn.closed
    assert conn.received() == b""


@pytest.mark.parametrize(
    "garbage",
    [b"\x47", b"\x41\x00\x01\x00\x00\x00\x01", b"\x70" + b"\x00" * 6, b"\x01"],
    ids=["reserved-bits", "reserved-bits-request", "encoding-6", "ping-with-bits"],
)
def test_garbage_closes_only_that_connection(broker, garbage):
    a, bad = login(broker, "a"), login(broker, "bad")
    bad.send(garbage)
    assert bad.closed
    assert bad.session.close_reason.startswith("protocol error")
    a.send(req(5, "0.0.1.2", {"topic": "t"}))
    assert messages(a) == [Response(5, Status.OK)]


def test_oversized_payload_is_a_protocol_error(broker):
    a = login(broker)
    a.send(b"\x50\x00\x01\x00\x00\x01\x04" + (64 << 20).to_bytes(4, "big"))
    assert a.closed


def test_authorize_hook_refusal_is_forbidden():
    class NoSecrets:
        @hookimpl
        def msgbroker_authorize(self, session, action, topic):
            return False if topic == "secret" else None

    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[NoSecrets()])
    a = login(broker)
    a.send(
        req(2, "0.0.1.2", {"topic": "secret"}) + req(3, "0.0.1.4", {"topic": "secret", "data": "x"})
    )
    assert [m.status for m in messages(a)] == [Status.FORBIDDEN, Status.FORBIDDEN]


def test_notify_from_client_reaches_its_route_without_reply():
    routes = Routes()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[routes])
    a = login(broker)
    a.send(codec.encode_binary(Notify(A("10.1.2.3"), Encoding.JSON, b'{"n":1}')))
    assert messages(a) == []
    assert routes.seen[-1].notify and routes.seen[-1].payload == {"n": 1}


def test_heartbeat_closes_two_intervals_after_the_last_byte_not_at_the_next_ping(broker):
    a = login(broker)
    broker.reactor.pump([10] * 4)  # to 40, in steps as a real clock runs
    assert messages(a) == [codec.PING]  # at 30
    a.send(b"\x00")  # last byte at 40
    broker.reactor.pump([10] * 5 + [9.9])  # to 99.9, in steps as a real clock runs
    assert not a.closed
    assert messages(a) == [codec.PING, codec.PING]  # at 60 and 90
    broker.reactor.advance(0.2)  # 100 = 40 + 2 x 30
    assert a.closed


def test_anonymous_stmp_session_may_publish_and_unicast_only(broker):
    anon = login(broker, ".")
    b = login(broker, "b")
    b.send(req(2, "0.0.1.2", {"topic": "t"}))
    b.received()
    anon.send(
        req(2, "0.0.1.2", {"topic": "t"})
        + req(3, "0.0.1.3", {"topic": "t"})
        + req(4, "0.0.1.6", {"data": "x"})
        + req(5, "0.0.1.4", {"topic": "t", "data": "hi"})
        + req(6, "0.0.1.5", {"to": "b", "data": "psst"})
    )
    assert [m.status for m in messages(anon)] == [
        Status.FORBIDDEN,
        Status.FORBIDDEN,
        Status.FORBIDDEN,
        Status.OK,
        Status.OK,
    ]
    assert [decoded(m)["from"] for m in messages(b)] == [".", "."]


def test_bad_notifies_from_a_client_are_dropped_quietly(broker):
    from twisted.logger import LogLevel, globalLogPublisher

    errors = []

    def observer(event):
        if event.get("log_level") in (LogLevel.error, LogLevel.critical):
            errors.append(event)

    globalLogPublisher.addObserver(observer)
    try:
        a = login(broker)
        a.send(codec.encode_binary(Notify(A("0.0.1.4"), Encoding.JSON, b"{bad json")))
        a.send(codec.encode_binary(Notify(A("0.0.1.2"), Encoding.JSON, b'{"no":"topic"}')))
        assert messages(a) == []
        assert not a.closed
    finally:
        globalLogPublisher.removeObserver(observer)
    assert errors == []


def test_subscribing_again_with_presence_turns_presence_on(broker):
    a, b = login(broker, "a"), login(broker, "b")
    a.send(req(2, "0.0.1.2", {"topic": "t"}))
    b.send(req(2, "0.0.1.2", {"topic": "t"}))
    a.received(), b.received()
    b.send(req(3, "0.0.1.2", {"topic": "t", "presence": True}))
    ok, snapshot = messages(b)  # Ok, then the current members but itself
    assert ok == Response(3, Status.OK)
    assert decoded(snapshot) == {"from": "a", "kind": "subscribe", "topic": "t"}
    b.send(req(4, "0.0.1.2", {"topic": "t", "presence": True}))
    assert messages(b) == [Response(4, Status.OK)]  # on already: no second snapshot
    c = login(broker, "c")
    c.send(req(2, "0.0.1.2", {"topic": "t"}))
    (joined,) = messages(b)
    assert decoded(joined) == {"from": "c", "kind": "subscribe", "topic": "t"}
    assert messages(a) == []  # a never asked for presence


class RenamingAuth:
    """Accepts any ``open`` login under the identity in upper case."""

    @hookimpl
    def msgbroker_authenticate(self, request):
        return Accept(request.identity.upper())


def test_a_login_accepted_under_another_identity_tells_the_client():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[RenamingAuth()])
    conn = connect(broker, "stmp")
    conn.send(req(1, "0.0.1.1", {"id": "alice", "scheme": "open"}))
    (reply,) = messages(conn)
    assert (reply.id, reply.status, decoded(reply)) == (1, Status.OK, {"id": "ALICE"})
    assert conn.session.identity == "ALICE"
    same = connect(broker, "stmp")
    same.send(req(1, "0.0.1.1", {"id": "BOB", "scheme": "open"}))
    assert messages(same) == [Response(1, Status.OK)]  # the identity asked for: no payload


def test_a_connection_lost_with_handlers_pending_cancels_them_quietly():
    cancelled = []

    class Never:
        @hookimpl
        def msgbroker_register_stmp_routes(self, router):
            def never(request):
                return defer.Deferred(lambda d: cancelled.append(request.action_text))

            router.add("10.0.0.0/24", never)

    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[Never()])
    conn = login(broker)
    conn.send(req(2, "10.0.0.1") + req(3, "10.0.0.2"))
    conn.drop()  # used to raise while cancelling the second one
    assert cancelled == ["10.0.0.1", "10.0.0.2"]
    assert conn.received() == b""
    assert broker.reactor.getDelayedCalls() == []
