"""Logins a scheme answers later (a Deferred; the password scheme hashes in a thread):
``Broker.begin_login``, the throttle token a pending check holds, and each protocol's
session holding what follows the login until it is decided — sans-IO, on a fake clock."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from msgbroker import Accept, BrokerConfig, Deny, hookimpl
from msgbroker.auth import LoginRequest
from msgbroker.limits import LoginThrottle
from msgbroker.plugins.sbus import codec as sbus_codec
from msgbroker.plugins.sbus.addresses import Credentials
from msgbroker.testing import drive, make_broker


class LaterScheme:
    """Answers every login when the test says so."""

    name = "later"

    def __init__(self) -> None:
        self.waiting: list[tuple[LoginRequest, Deferred]] = []

    def authenticate(self, request):
        d = Deferred()
        self.waiting.append((request, d))
        return d

    def answer(self, accept: bool) -> None:
        request, d = self.waiting.pop(0)
        d.callback(Accept(request.identity) if accept else Deny("no"))


class LaterPlugin:
    def __init__(self) -> None:
        self.scheme = LaterScheme()

    @hookimpl
    def msgbroker_register_auth_schemes(self, register):
        register(self.scheme)


def later_broker(**config):
    plugin = LaterPlugin()
    config.setdefault("login_failure_delay", 1.0)
    broker = make_broker(BrokerConfig(auth=("later", "open"), **config), plugins=[plugin])
    return broker, plugin.scheme


def test_ssmp_holds_what_follows_a_login_until_it_is_accepted():
    broker, scheme = later_broker()
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice later x\nSUBSCRIBE t\nMCAST t hi\n")
    assert d.received() == b""  # nothing answered before the login
    assert d.session.reading_held  # and nothing more read meanwhile
    d.feed(b"PING\n")  # what a transport delivered anyway waits too
    scheme.answer(True)
    assert d.received() == b"200\n200\n200\n000 . PONG\n"
    assert not d.session.reading_held
    assert broker.hub.lookup("alice") is d.session


def test_ssmp_refused_later_is_answered_late_and_nothing_after_it_is_handled():
    broker, scheme = later_broker()
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice later x\nSUBSCRIBE t\n")
    scheme.answer(False)
    assert d.received() == b""
    d.advance(1.0)
    assert d.received() == b"401 later open\n"
    assert d.closed
    assert "t" not in broker.hub.topics


def test_a_session_gone_before_the_answer_is_not_logged_in():
    broker, scheme = later_broker()
    d = drive(broker, "ssmp")
    d.feed(b"LOGIN alice later x\n")
    d.lose()
    scheme.answer(True)
    assert broker.hub.lookup("alice") is None


def test_checks_from_one_address_hold_its_tokens_and_the_others_wait_their_turn():
    broker, scheme = later_broker(login_attempts=2.0)
    drivers = [drive(broker, "ssmp") for _ in range(4)]
    for number, d in enumerate(drivers):
        d.feed(b"LOGIN u%d later x\n" % number)
    # two tokens: two checks at once, the other logins wait (not refused)
    assert [request.identity for request, _ in scheme.waiting] == ["u0", "u1"]
    scheme.answer(True)  # accepted: its token is free again, the next check starts
    assert [request.identity for request, _ in scheme.waiting] == ["u1", "u2"]
    for _ in range(3):
        scheme.answer(True)
    assert [d.received() for d in drivers] == [b"200\n"] * 4  # an honest burst: all in


def test_failures_empty_the_bucket_and_the_waiting_logins_are_refused_unheard():
    broker, scheme = later_broker(login_attempts=2.0)
    drivers = [drive(broker, "ssmp") for _ in range(4)]
    for number, d in enumerate(drivers):
        d.feed(b"LOGIN u%d later x\n" % number)
    scheme.answer(False)  # one token left, held by u1's check: u2 still waits
    assert [request.identity for request, _ in scheme.waiting] == ["u1"]
    scheme.answer(False)  # none left: u2 and u3 are refused without a check
    assert scheme.waiting == []
    for d in drivers:
        d.advance(1.0)
    assert [d.received() for d in drivers] == [b"401 later open\n"] * 4
    assert broker.hub.stats.refused == 2


def test_a_waiting_login_whose_connection_closed_is_skipped():
    broker, scheme = later_broker(login_attempts=1.0)
    first, gone, third = (drive(broker, "ssmp") for _ in range(3))
    for number, d in enumerate((first, gone, third)):
        d.feed(b"LOGIN u%d later x\n" % number)
    gone.lose()
    scheme.answer(True)
    assert [request.identity for request, _ in scheme.waiting] == ["u2"]


def test_throttle_checking_and_checked():
    throttle = LoginThrottle(rate=1.0)
    throttle.checking("h")
    assert throttle.allows("h", 0.0)  # not refused: it may wait
    assert not throttle.room("h", 0.0)  # but no other check may start
    throttle.checked("h")
    assert throttle.room("h", 0.0)
    throttle.checking("h")
    throttle.checked("h")
    throttle.failed("h", 0.0)
    assert not throttle.allows("h", 0.5)
    off = LoginThrottle(rate=0.0)
    off.checking("h")
    assert off.allows("h", 0.0) and off.room("h", 0.0)
    off.checked("h")


def test_broker_login_refuses_a_scheme_that_answers_later():
    broker, scheme = later_broker()
    d = drive(broker, "ssmp")
    result = broker.login(d.session, LoginRequest("x", "alice", "later", b"", "127.0.0.1"))
    assert isinstance(result, Deny) and "begin_login" in result.reason


def test_mm2_confirmation_waits_for_a_login_answered_later():
    from msgbroker.plugins.mm2 import codec

    broker, scheme = later_broker()
    d = drive(broker, "mm2")
    hello = codec.Handshake("alice", ("pubsub", "x-login"))
    d.feed(codec.encode_handshake(hello))
    d.received()
    confirm = codec.Handshake(
        "alice",
        ("pubsub", codec.Extension("x-login", (("scheme", "later"), ("credential", "x y")))),
    )
    d.feed(
        codec.encode_handshake(confirm) + codec.encode_frame(codec.MessageFrame(1, "@alice", b"me"))
    )
    request, _ = scheme.waiting[0]
    assert (request.scheme, request.credential) == ("later", b"x y")
    assert d.received() == b""
    scheme.answer(True)
    d.advance(0)  # the broker's batch goes out on the next turn, as on the reactor
    assert b"me" in d.received()  # the MESSAGE to itself, read once logged in


def test_sbus_login_answered_later_holds_the_packets_after_it():
    broker, scheme = later_broker()
    d = drive(broker, "sbus", credentials=Credentials(pid=42, uid=1000, gid=100))
    login = sbus_codec.encode_packet(sbus_codec.login_request("carol", "later", b"pw"))
    d.server.packets_received([login, b"SUB t", b"MSG t\0hi"])
    assert d.received_packets() == []
    scheme.answer(True)
    assert d.received_packets() == [b"CMSG !/login\0ok\0carol", b"MSG t\0hi"]  # its echo
    assert d.session.identity == "carol"
    assert broker.hub.lookup("carol") is d.session
