"""SSMP server behaviour, in memory: every rule of the spec and of docs/ssmp.md, "Decisions"."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, hookimpl, per_topic
from msgbroker.testing import connect, make_broker


@pytest.fixture
def broker():
    return make_broker(BrokerConfig(auth=("open",)))


def login(broker, identity="alice", host="127.0.0.1"):
    conn = connect(broker, "ssmp", host=host)
    conn.send(b"LOGIN %s open\n" % identity.encode())
    assert conn.received() == b"200\n"
    return conn


def test_login_ok_then_second_login_is_405_and_close(broker):
    conn = login(broker)
    conn.send(b"LOGIN bob open\n")
    assert conn.received() == b"405\n"
    assert conn.closed


def test_first_request_not_login_is_400_and_close(broker):
    conn = connect(broker, "ssmp")
    conn.send(b"PING\n")
    assert conn.received() == b"400\n"
    assert conn.closed


def test_unknown_scheme_is_401_with_scheme_list_and_close():
    broker = make_broker(BrokerConfig(auth=("open", "secret"), secret_file=__file__))
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN alice kerberos\n")
    broker.reactor.advance(broker.config.login_failure_delay)
    assert conn.received() == b"401 open secret\n"
    assert conn.closed


def test_a_refused_login_is_answered_after_the_failure_delay_and_reads_nothing_more():
    broker = make_broker(
        BrokerConfig(auth=("secret",), secret_file=__file__, login_failure_delay=2.0)
    )
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN alice secret wrong\nLOGIN alice secret wrong\nPING\n")
    broker.reactor.advance(1.9)
    assert conn.received() == b"" and not conn.closed
    broker.reactor.advance(0.1)
    assert conn.received() == b"401 secret\n"
    assert conn.closed


def test_failed_logins_from_one_address_are_throttled_before_the_credential_is_checked():
    checked = []

    class Counting:
        @hookimpl
        def msgbroker_authenticate(self, request):
            checked.append(request.identity)

    broker = make_broker(
        BrokerConfig(auth=("secret",), secret_file=__file__, login_attempts=2.0),
        plugins=[Counting()],
    )
    for i in range(5):
        connect(broker, "ssmp", host="192.0.2.1").send(b"LOGIN u%d secret wrong\n" % i)
    assert checked == ["u0", "u1"]  # a bucket of 2; the rest refused unheard
    assert broker.hub.stats.refused == 3
    connect(broker, "ssmp", host="192.0.2.2").send(b"LOGIN other secret wrong\n")
    assert checked[-1] == "other"  # another address is not held back
    broker.reactor.advance(0.5)  # one token back at 2 per second
    connect(broker, "ssmp", host="192.0.2.1").send(b"LOGIN again secret wrong\n")
    assert checked[-1] == "again"


def test_open_credential_is_ignored(broker):
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN alice open whatever credential\n")
    assert conn.received() == b"200\n"


def test_default_config_allows_open_login_from_loopback_only():
    broker = make_broker(BrokerConfig())
    assert broker.enabled_schemes == ("open",)
    local = connect(broker, "ssmp", host="127.0.0.1")
    local.send(b"LOGIN a open\n")
    assert local.received() == b"200\n"
    remote = connect(broker, "ssmp", host="192.0.2.7")
    remote.send(b"LOGIN b open\n")
    broker.reactor.advance(broker.config.login_failure_delay)
    assert remote.received() == b"401 open\n"
    assert remote.closed


def test_login_timeout_closes_without_response(broker):
    conn = connect(broker, "ssmp")
    broker.reactor.advance(9.9)
    assert not conn.closed
    broker.reactor.advance(0.2)
    assert conn.closed
    assert conn.received() == b""


def test_login_timeout_is_configurable():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=2))
    conn = connect(broker, "ssmp")
    broker.reactor.advance(2.1)
    assert conn.closed


def test_logged_in_connection_is_not_closed_by_login_timer(broker):
    conn = login(broker)
    broker.reactor.advance(15)
    assert not conn.closed


def test_login_ok_sent_after_identity_registered_so_immediate_ucast_works(broker):
    alice = connect(broker, "ssmp")
    bob = login(broker, "bob")
    alice.send(b"LOGIN alice open\nUCAST bob hi\n")
    assert alice.received() == b"200\n200\n"
    assert bob.received() == b"000 alice UCAST bob hi\n"


def test_new_login_kicks_old_connection_with_unsubscribe_events(broker):
    watcher = login(broker, "w")
    watcher.send(b"SUBSCRIBE t PRESENCE\n")
    old = login(broker, "alice")
    old.send(b"SUBSCRIBE t\n")
    watcher.received()
    new = login(broker, "alice")
    assert old.closed
    assert watcher.received() == b"000 alice UNSUBSCRIBE t\n"
    new.send(b"UCAST alice me\n")
    assert new.received() == b"000 alice UCAST alice me\n200\n"


def test_ping_pong(broker):
    conn = login(broker)
    conn.send(b"PING\n")
    assert conn.received() == b"000 . PONG\n"
    conn.send(b"PONG\n")
    assert conn.received() == b""


def test_keepalive_pings_after_idle_then_closes_without_any_request(broker):
    conn = login(broker)
    broker.reactor.advance(29)
    assert conn.received() == b""
    broker.reactor.advance(1.5)
    assert conn.received() == b"000 . PING\n"
    broker.reactor.advance(29)
    assert not conn.closed
    broker.reactor.advance(1.5)
    assert conn.closed
    assert conn.session.close_reason == "keepalive timeout"


def test_keepalive_any_request_counts_as_activity(broker):
    conn = login(broker)
    for _ in range(5):
        broker.reactor.advance(20)
        conn.send(b"MCAST t x\n")
    assert b"PING" not in conn.received()
    broker.reactor.advance(31)
    assert conn.received() == b"000 . PING\n"
    conn.send(b"PONG\n")
    broker.reactor.advance(31)
    assert not conn.closed
    assert conn.received() == b"000 . PING\n"


def test_keepalive_interval_is_configurable():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=5))
    conn = login(broker)
    broker.reactor.advance(5.1)
    assert conn.received() == b"000 . PING\n"
    broker.reactor.advance(5.1)
    assert conn.closed


def test_subscribe_twice_is_409_unsubscribe_unknown_is_404(broker):
    conn = login(broker)
    conn.send(b"SUBSCRIBE t\nSUBSCRIBE t\nUNSUBSCRIBE t\nUNSUBSCRIBE t\n")
    assert conn.received() == b"200\n409\n200\n404\n"
    assert not conn.closed


def test_subscribe_with_bad_option_is_400_and_close(broker):
    conn = login(broker)
    conn.send(b"SUBSCRIBE t NOPE\n")
    assert conn.received() == b"400\n"
    assert conn.closed


def test_mcast_reaches_subscribers_not_sender_and_is_200_without_subscribers(broker):
    a, b = login(broker, "a"), login(broker, "b")
    a.send(b"SUBSCRIBE t\n")
    b.send(b"SUBSCRIBE t\n")
    a.received(), b.received()
    a.send(b"MCAST t hello world\n")
    assert a.received() == b"200\n"
    assert b.received() == b"000 a MCAST t hello world\n"
    a.send(b"MCAST empty x\n")
    assert a.received() == b"200\n"


def test_mcast_does_not_need_subscription(broker):
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    a.send(b"MCAST t p\n")
    assert b.received() == b"000 a MCAST t p\n"


def test_binary_payload_forwarded_unchanged(broker):
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    payload = bytes(range(256)) * 4  # 1024 bytes, LF and NUL inside
    frame = b"MCAST t " + (len(payload) - 1).to_bytes(2, "big") + payload + b"\n"
    a.send(frame[:100])
    a.send(frame[100:])
    assert a.received() == b"200\n"
    assert b.received() == b"000 a " + frame


def test_ucast_unknown_is_404_and_to_self_is_delivered(broker):
    a = login(broker, "a")
    a.send(b"UCAST nobody x\nUCAST a self\n")
    assert a.received() == b"404\n000 a UCAST a self\n200\n"


def test_bcast_once_per_peer_sharing_topics(broker):
    s, x, y, z = (login(broker, n) for n in "sxyz")
    s.send(b"SUBSCRIBE t1\nSUBSCRIBE t2\n")
    x.send(b"SUBSCRIBE t1\nSUBSCRIBE t2\n")
    y.send(b"SUBSCRIBE t2\n")
    z.send(b"SUBSCRIBE t3\n")
    for c in (s, x, y, z):
        c.received()
    s.send(b"BCAST hi all\n")
    assert s.received() == b"200\n"
    assert x.received() == b"000 s BCAST hi all\n"
    assert y.received() == b"000 s BCAST hi all\n"
    assert z.received() == b""


def test_anonymous_may_mcast_only(broker):
    sub = login(broker, "sub")
    sub.send(b"SUBSCRIBE t\n")
    sub.received()
    anon1, anon2 = login(broker, "."), login(broker, ".")
    anon1.send(b"MCAST t from-anon\n")
    assert anon1.received() == b"200\n"
    assert sub.received() == b"000 . MCAST t from-anon\n"
    anon2.send(b"SUBSCRIBE t\nUNSUBSCRIBE t\nBCAST x\n")
    assert anon2.received() == b"405\n405\n405\n"
    assert not anon2.closed and not anon1.closed
    sub.send(b"UCAST . x\n")
    assert sub.received() == b"404\n"


def test_presence_snapshot_after_200_then_events(broker):
    m1, m2 = login(broker, "m1"), login(broker, "m2")
    m1.send(b"SUBSCRIBE t PRESENCE\n")
    m2.send(b"SUBSCRIBE t\n")
    m1.received(), m2.received()
    w = login(broker, "w")
    w.send(b"SUBSCRIBE t PRESENCE\n")
    assert w.received() == b"200\n000 m1 SUBSCRIBE t PRESENCE\n000 m2 SUBSCRIBE t\n"
    assert m1.received() == b"000 w SUBSCRIBE t PRESENCE\n"
    m2.send(b"UNSUBSCRIBE t\n")
    assert w.received() == b"000 m2 UNSUBSCRIBE t\n"
    assert m2.received() == b"200\n"


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("close", "close requested"),
        ("drop", "closed by peer"),
        ("timeout", "keepalive timeout"),
        ("grammar", "protocol error: bad verb b'bad'"),
    ],
)
def test_every_kind_of_close_sends_unsubscribe_events(broker, how, reason):
    w = login(broker, "w")
    w.send(b"SUBSCRIBE t1 PRESENCE\nSUBSCRIBE t2 PRESENCE\n")
    leaver = login(broker, "leaver")
    leaver.send(b"SUBSCRIBE t1\nSUBSCRIBE t2\n")
    w.received(), leaver.received()
    if how == "close":
        leaver.send(b"CLOSE\n")
        assert leaver.received() == b"200\n"
    elif how == "drop":
        leaver.drop()
    elif how == "timeout":
        w_keepalive = broker.reactor
        for _ in range(4):  # keep w alive while leaver times out
            w_keepalive.advance(20)
            w.send(b"PONG\n")
    else:
        leaver.send(b"bad\n")
        assert leaver.received() == b"400\n"
    assert leaver.closed
    assert leaver.session.close_text == reason
    events = w.received().replace(b"000 . PING\n", b"")
    assert sorted(events.splitlines()) == [
        b"000 leaver UNSUBSCRIBE t1",
        b"000 leaver UNSUBSCRIBE t2",
    ]


def test_unknown_verb_is_501_and_connection_stays_open(broker):
    conn = login(broker)
    conn.send(b"FROB\nFROB x\nFROB x some payload\nPING\n")
    assert conn.received() == b"501\n501\n501\n000 . PONG\n"
    assert not conn.closed


def test_grammar_error_after_valid_requests_keeps_what_was_accepted(broker):
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    a.send(b"MCAST t one\nMCAST t two\nMCAST t \n MCAST t three\n")
    assert a.received() == b"200\n200\n400\n"
    assert a.closed
    assert b.received() == b"000 a MCAST t one\n000 a MCAST t two\n"
    assert not b.closed


def test_input_after_close_is_ignored(broker):
    a = login(broker, "a")
    a.send(b"CLOSE\nMCAST t x\n")
    assert a.received() == b"200\n"


class DenyTopicSecret:
    @hookimpl
    def msgbroker_authorize(self, session, action, topic):
        if topic == "secret":
            return False
        return None


def test_authorize_hook_refuses_with_405():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[DenyTopicSecret()])
    a = login(broker, "a")
    a.send(b"SUBSCRIBE secret\nMCAST secret x\nSUBSCRIBE public\n")
    assert a.received() == b"405\n405\n200\n"


def test_pipelined_mcasts_are_forwarded_in_order_with_one_200_each(broker):
    a, b, c = login(broker, "a"), login(broker, "b"), login(broker, "c")
    b.send(b"SUBSCRIBE t\n")
    c.send(b"SUBSCRIBE u\n")
    b.received(), c.received()
    a.send(b"MCAST t 1\nMCAST t 2\nMCAST u 3\nMCAST t 4\nMCAST t \x00\x005\nMCAST t 6\nMCAST t 7\n")
    assert a.received() == b"200\n" * 7
    assert b.received() == (
        b"000 a MCAST t 1\n000 a MCAST t 2\n000 a MCAST t 4\n"
        b"000 a MCAST t \x00\x005\n000 a MCAST t 6\n000 a MCAST t 7\n"
    )
    assert c.received() == b"000 a MCAST u 3\n"


def test_pipelined_mcasts_reach_a_grammar_error_and_stop_there(broker):
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    a.send(b"MCAST t 1\nMCAST t 2\nMCAST t " + b"x" * 1025 + b"\nMCAST t 3\n")
    assert a.received() == b"200\n200\n400\n"
    assert b.received() == b"000 a MCAST t 1\n000 a MCAST t 2\n"


class RoutedRecorder:
    def __init__(self):
        self.payloads = []

    @hookimpl
    def msgbroker_message_routed(self, message, result):
        self.payloads.append((message.payload, dict(result.recipients)))


def test_pipelined_mcasts_are_each_seen_by_message_routed_and_authorize():
    rec = RoutedRecorder()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[rec, DenyTopicSecret()])
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    a.send(b"MCAST t 1\nMCAST t 2\nMCAST secret 3\nMCAST secret 4\n")
    assert a.received() == b"200\n200\n405\n405\n"
    assert rec.payloads == [(b"1", {"ssmp": 1}), (b"2", {"ssmp": 1})]
    assert b.received() == b"000 a MCAST t 1\n000 a MCAST t 2\n"


class CountingGuard:
    """Refuses "secret"; counts what it is asked."""

    def __init__(self):
        self.asked = []

    def msgbroker_authorize(self, session, action, topic):
        self.asked.append(topic)
        return topic != "secret"


class PerTopicGuard(CountingGuard):
    """Marked as deciding per topic (msgbroker.per_topic): a run is asked about once."""

    @hookimpl
    @per_topic
    def msgbroker_authorize(self, session, action, topic):
        return super().msgbroker_authorize(session, action, topic)


class PerRequestGuard(CountingGuard):
    @hookimpl
    def msgbroker_authorize(self, session, action, topic):
        return super().msgbroker_authorize(session, action, topic)


@pytest.mark.parametrize(("guard", "asked"), [(PerTopicGuard, 2), (PerRequestGuard, 5)])
def test_pipelined_mcasts_are_asked_about_per_run_or_per_request(guard, asked):
    """A per-topic hook is asked once per run (and the run keeps its fast path); one that
    asks about each request sees every MCAST. The answers are the same either way."""
    hook = guard()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[hook])
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\n")
    b.received()
    hook.asked.clear()
    a.send(b"MCAST t 1\nMCAST t 2\nMCAST t 3\nMCAST secret 4\nMCAST secret 5\n")
    assert a.received() == b"200\n200\n200\n405\n405\n"
    assert b.received() == b"000 a MCAST t 1\n000 a MCAST t 2\n000 a MCAST t 3\n"
    assert len(hook.asked) == asked


def test_subscribe_over_a_limit_is_405_and_the_connection_stays_open():
    broker = make_broker(BrokerConfig(auth=("open",), max_subscriptions=2, max_topics=3))
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN alice open\nSUBSCRIBE a\nSUBSCRIBE b\nSUBSCRIBE c\nPING\n")
    assert conn.received() == b"200\n200\n200\n405\n000 . PONG\n"
    other = connect(broker, "ssmp")
    other.send(b"LOGIN bob open\nSUBSCRIBE c\nSUBSCRIBE d\n")
    assert other.received() == b"200\n200\n405\n"  # a, b, c: the broker's 3 topics
    assert not conn.closed and not other.closed


def test_a_connection_over_the_connection_limits_is_refused_before_anything():
    broker = make_broker(
        BrokerConfig(auth=("open",), max_connections=3, max_connections_per_address=2)
    )
    first = connect(broker, "ssmp", host="192.0.2.1")
    connect(broker, "ssmp", host="192.0.2.1")
    with pytest.raises(ConnectionRefusedError):
        connect(broker, "ssmp", host="192.0.2.1")
    connect(broker, "ssmp", host="192.0.2.2")
    with pytest.raises(ConnectionRefusedError):
        connect(broker, "ssmp", host="192.0.2.3")
    assert broker.hub.stats.refused == 2
    first.drop()
    connect(broker, "ssmp", host="192.0.2.3")  # room again
