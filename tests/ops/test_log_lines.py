"""What the log says, as rules: a burst costs one line when it starts and one when its
interval ends (with a count); refused logins are counted per address; what a client got
wrong is debug, on every protocol."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from msgbroker import BrokerConfig
from msgbroker.limits import RateLimitedLog
from msgbroker.plugins.sbus.addresses import Credentials
from msgbroker.testing import connect, drive, make_broker
from tests.ops.logcapture import captured_log


def test_a_burst_is_said_when_it_starts_and_counted_when_its_interval_ends():
    clock = Clock()
    said = []
    log = RateLimitedLog(lambda text, more: said.append((text, more)), 10.0, clock.callLater)
    log("k", clock.seconds(), "first")
    for i in range(5):
        clock.advance(1)
        log("k", clock.seconds(), f"more {i}")
    log("other", clock.seconds(), "other")
    assert said == [("first", 0), ("other", 0)]
    clock.advance(4.9)
    assert len(said) == 2  # still counting
    clock.advance(0.1)  # 10 s after "first": the last one said, with the others counted
    assert said[-1] == ("more 4", 4)
    clock.advance(100)  # nothing more to say
    assert len(said) == 3
    log("k", clock.seconds(), "later")  # a new burst starts with its own line
    assert said[-1] == ("later", 0)


def test_a_burst_still_being_counted_is_said_when_the_log_is_flushed():
    clock = Clock()
    said = []
    log = RateLimitedLog(lambda text, more: said.append((text, more)), 10.0, clock.callLater)
    log("k", 0.0, "a")
    log("k", 0.0, "b")
    log("k", 0.0, "c")
    log.flush()
    assert said == [("a", 0), ("c", 1)]
    assert not clock.getDelayedCalls()
    clock.advance(10)
    assert len(said) == 2


def test_refused_logins_are_one_line_per_address_per_interval(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"right\n")
    config = BrokerConfig(auth=("secret",), secret_file=str(secret), login_attempts=0)
    broker = make_broker(config)
    with captured_log() as log:
        for _ in range(20):
            connect(broker, "ssmp", host="192.0.2.1").send(b"LOGIN mallory secret wrong\n")
        connect(broker, "ssmp", host="192.0.2.2").send(b"LOGIN eve secret wrong\n")
        refused = [t for t in log.texts("info") if "login refused" in t]
        assert refused == [
            "ssmp login refused for 'mallory' from 192.0.2.1 (secret): wrong secret",
            "ssmp login refused for 'eve' from 192.0.2.2 (secret): wrong secret",
        ]
        broker.reactor.advance(10)
        refused = [t for t in log.texts("info") if "login refused" in t]
        assert refused[2:] == [
            "ssmp login refused for 'mallory' from 192.0.2.1 (secret): wrong secret "
            "(and 18 more like it since the last line)"
        ]


def test_the_broker_says_the_counts_it_holds_when_it_stops(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"right\n")
    broker = make_broker(BrokerConfig(auth=("secret",), secret_file=str(secret)))
    with captured_log() as log:
        for _ in range(3):
            connect(broker, "ssmp", host="192.0.2.1").send(b"LOGIN m secret wrong\n")
        broker.stopped()
        refused = [t for t in log.texts("info") if "login refused" in t]
    assert len(refused) == 2
    assert refused[1].endswith("(and 1 more like it since the last line)")


@pytest.mark.parametrize(
    ("protocol", "garbage"),
    [
        ("ssmp", b"NOT A LOGIN\n"),
        ("stmp", b"\xff" * 16),
        ("mm2", b"\xff" * 16),
        ("sbus", b"HELLO"),
    ],
)
def test_what_a_client_got_wrong_is_a_debug_line(protocol, garbage):
    broker = make_broker()
    with captured_log() as log:
        if protocol == "sbus":
            credentials = Credentials(pid=1, uid=1000, gid=1000)
            driver = drive(broker, "sbus", host="", credentials=credentials)
            driver.feed(garbage)
            assert driver.closed
        else:
            conn = connect(broker, protocol)
            conn.send(garbage)
            assert conn.closed
    assert log.texts("debug"), "the protocol error was not logged at all"
    assert {level for level, _, _ in log} == {"debug"}, log.texts()
