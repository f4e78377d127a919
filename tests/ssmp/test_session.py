"""The SSMP server session alone, sans-IO (msgbroker.testing.drive): any split of the input
gives the same conversation, and its timers run on a fake clock, ticked explicitly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig
from msgbroker.reasons import CloseReason
from msgbroker.testing import drive, make_broker

CONVERSATION = (
    b"LOGIN alice open\n"
    b"SUBSCRIBE news PRESENCE\n"
    b"MCAST news hello\n"
    b"MCAST news again\n"
    b"UCAST alice to-myself\n"
    b"PING\n"
    b"UNSUBSCRIBE news\n"
    b"CLOSE\n"
)


#: what the broker answers: a sender never receives its own MCAST; a UCAST to oneself arrives
EXPECTED = (
    b"200\n"  # LOGIN
    b"200\n"  # SUBSCRIBE
    b"200\n200\n"  # two MCASTs
    b"000 alice UCAST alice to-myself\n200\n"
    b"000 . PONG\n"
    b"200\n"  # UNSUBSCRIBE
    b"200\n"  # CLOSE
)


def test_the_whole_conversation_at_once():
    driver = drive(make_broker(), "ssmp")
    driver.feed(CONVERSATION)
    assert driver.received() == EXPECTED
    assert driver.closed_by == "close"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 12), max_size=40))
def test_any_split_of_the_input_gives_the_same_output(sizes):
    driver = drive(make_broker(), "ssmp")
    driver.feed_split(CONVERSATION, sizes)
    assert driver.received() == EXPECTED
    assert driver.session.close_reason is CloseReason.REQUESTED


def test_no_login_within_the_login_timeout_aborts_without_a_word():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=5))
    driver = drive(broker, "ssmp")
    driver.feed(b"LOG")
    driver.advance(4.9)
    assert not driver.closed
    driver.advance(0.2)
    assert driver.closed_by == "abort"
    assert driver.received() == b""
    assert driver.session.close_reason is CloseReason.LOGIN_TIMEOUT


def test_an_idle_peer_is_pinged_then_closed_after_two_intervals():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    driver = drive(broker, "ssmp")
    driver.feed(b"LOGIN alice open\n")
    driver.received()
    driver.advance(30)
    assert driver.received() == b"000 . PING\n"
    driver.advance(29)
    assert not driver.closed
    driver.advance(1)
    assert driver.closed
    assert driver.session.close_reason is CloseReason.KEEPALIVE_TIMEOUT


def test_a_pong_keeps_the_peer_alive():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    driver = drive(broker, "ssmp")
    driver.feed(b"LOGIN alice open\n")
    assert driver.received() == b"200\n"
    for _ in range(5):
        driver.advance(30)
        assert driver.received() == b"000 . PING\n"
        driver.feed(b"PONG\n")
    assert not driver.closed


@pytest.mark.parametrize("delay", [0.5, 2.0])
def test_a_refused_login_is_answered_after_the_failure_delay(delay, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    broker = make_broker(
        BrokerConfig(auth=("secret",), secret_file=str(secret), login_failure_delay=delay)
    )
    driver = drive(broker, "ssmp")
    driver.feed(b"LOGIN alice secret wrong\nPING\n")
    driver.advance(delay * 0.99)
    assert driver.received() == b""
    driver.advance(delay * 0.02)
    assert driver.received() == b"401 secret\n"  # and nothing for the PING after it
    assert driver.session.close_reason is CloseReason.LOGIN_REFUSED


def test_a_slow_peer_is_cut_and_its_subscription_ends():
    broker = make_broker(BrokerConfig(auth=("open",), max_backlog=100))
    watcher = drive(broker, "ssmp")
    watcher.feed(b"LOGIN w open\nSUBSCRIBE t PRESENCE\n")
    slow = drive(broker, "ssmp")
    slow.feed(b"LOGIN slow open\nSUBSCRIBE t\n")
    publisher = drive(broker, "ssmp")
    publisher.feed(b"LOGIN pub open\n")
    watcher.received()
    slow.wire.fill()
    publisher.feed(b"MCAST t " + b"x" * 200 + b"\n")
    assert slow.session.close_reason is CloseReason.SLOW_CONSUMER
    assert slow.closed_by == "abort"
    assert watcher.received().endswith(b"000 slow UNSUBSCRIBE t\n")
