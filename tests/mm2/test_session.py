"""The Micromessage2 server session alone, sans-IO (msgbroker.testing.drive): a real
conversation (the handshake of tests/vectors/micromessage2.md, then messages) split at any
points gives the same output, and its timers — the login timeout, the late answer to a
refused login, and no idle timer at all — run on a fake clock, ticked explicitly."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import ErrorFrame, ExtensionFrame, Handshake, MessageFrame
from msgbroker.reasons import CloseReason
from msgbroker.testing import drive, make_broker

VECTORS = (Path(__file__).parents[1] / "vectors" / "micromessage2.md").read_text()


def vector(name):
    """The bytes of vector ``name`` (``V1``, ``V12``, ...)."""
    match = re.search(rf"^### {name} .*?```\n(.*?)```", VECTORS, re.DOTALL | re.MULTILINE)
    return bytes.fromhex(match.group(1))


def frames(*items):
    return b"".join(codec.encode_frame(item) for item in items)


#: the dotnet type of V12
TYPE = b"OneTrueError.Contracts.Reports,OneTrueError.Client"
#: ids from the step-3 lists of V3: json 1, dotnet 2, batch-ack 3 (max-count 10)
DOTNET, BATCH_ACK = 2, 3

#: "hulk" (V1 hello, V3 confirm: json and dotnet required, batch-ack) names the type of its
#: messages (V12), publishes (V6, to nobody), unicasts to itself — once whole, once in two
#: fragments — acknowledges what it got, and unicasts once more with properties
ACKED_CONVERSATION = (
    vector("V1")
    + vector("V3")
    + vector("V12")
    + vector("V6")
    + frames(
        MessageFrame(2, "@hulk", b'{"n": 2}'),
        MessageFrame(3, "@hulk", b"[1,", continued=True),
        MessageFrame(3, "@hulk", b"2]"),
        ExtensionFrame(BATCH_ACK, (2).to_bytes(2, "big")),
        MessageFrame(4, "@hulk", b"true", {"k": "v"}),
    )
)

#: what "hulk" gets besides the acks of its own messages: our handshake reply, then its
#: unicasts, numbered by us, after its own type frame (with its own dotnet id)
REPLY = Handshake("msgbroker", (), ("pubsub", "batch-ack"), minor=1)
DELIVERED = [
    ExtensionFrame(DOTNET, TYPE),
    MessageFrame(1, "@hulk", b'{"n": 2}'),
    MessageFrame(2, "@hulk", b"[1,2]"),
    MessageFrame(3, "@hulk", b"true", {"k": "v"}),
]


def split_output(data):
    """(the handshake reply, the other frames, the acks' numbers) of what the server wrote."""
    decoder = codec.HandshakeDecoder()
    reply = decoder.feed(data)
    acks, others = [], []
    for frame in codec.FrameDecoder().feed(decoder.trailing_data):
        if isinstance(frame, ExtensionFrame) and frame.ext_id == BATCH_ACK:
            acks.append(codec.parse_ack(frame))
        else:
            others.append(frame)
    return reply, others, acks


def test_the_vector_handshake_and_messages_at_once():
    driver = drive(make_broker(), "mm2")
    driver.feed(ACKED_CONVERSATION)
    reply, others, acks = split_output(driver.received())
    assert reply == REPLY
    assert others == DELIVERED
    assert acks == [4]  # one cumulative ack for the chunk: its last message
    assert not driver.closed
    assert driver.session.identity == "hulk"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), max_size=60))
def test_any_split_gives_the_same_frames_and_acks_that_only_grow(sizes):
    driver = drive(make_broker(), "mm2")
    driver.feed_split(ACKED_CONVERSATION, sizes)
    reply, others, acks = split_output(driver.received())
    assert reply == REPLY
    assert others == DELIVERED
    # one ack per chunk that completed a message, cumulative: increasing, ending at the last
    assert acks == sorted(set(acks))
    assert acks[-1] == 4
    assert not driver.closed


#: the same without acks (V4: minor 0; confirmed with the same lists): the output is then
#: byte for byte the same whatever the split
PLAIN_CONVERSATION = (
    vector("V4")
    + codec.encode_handshake(Handshake("hulk", ("json", "dotnet"), minor=0))
    + vector("V12")
    + vector("V6")
    + frames(
        MessageFrame(2, "@hulk", b'{"n": 2}'),
        MessageFrame(3, "@hulk", b"[1,", continued=True),
        MessageFrame(3, "@hulk", b"2]"),
        MessageFrame(4, "@hulk", b"true", {"k": "v"}),
    )
)


def whole_output(conversation):
    driver = drive(make_broker(), "mm2")
    driver.feed(conversation)
    return driver.received()


PLAIN_OUTPUT = whole_output(PLAIN_CONVERSATION)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), max_size=60))
def test_without_acks_any_split_gives_the_same_bytes(sizes):
    driver = drive(make_broker(), "mm2")
    driver.feed_split(PLAIN_CONVERSATION, sizes)
    assert driver.received() == PLAIN_OUTPUT


def test_the_plain_conversations_output():
    decoder = codec.HandshakeDecoder()
    assert decoder.feed(PLAIN_OUTPUT) == Handshake("msgbroker", (), ("pubsub", "batch-ack"))
    assert list(codec.FrameDecoder().feed(decoder.trailing_data)) == DELIVERED


@given(st.integers(1, len(ACKED_CONVERSATION) - 1))
def test_a_peer_gone_at_any_point_leaves_nothing_behind(cut):
    broker = make_broker()
    driver = drive(broker, "mm2")
    driver.feed(ACKED_CONVERSATION[:cut])
    driver.lose()
    assert driver.timers.deadline is None
    assert broker.sessions == {} and broker.hub.identities == {}


def test_a_bad_frame_after_the_handshake_is_an_error_frame_then_a_flushed_close():
    driver = drive(make_broker(), "mm2")
    driver.feed(vector("V1") + vector("V3") + b"\xe0garbage")
    reply, others, _ = split_output(driver.received())
    assert isinstance(others[-1], ErrorFrame)
    assert driver.closed_by == "close"
    assert driver.session.close_reason is CloseReason.PROTOCOL_ERROR
    assert driver.session.close_text == f"protocol error: {others[-1].text}"


def test_an_error_frame_instead_of_the_hello_is_the_peer_giving_up():
    driver = drive(make_broker(), "mm2")
    driver.feed(vector("V14"))
    assert driver.received() == b""
    assert driver.session.close_reason is CloseReason.PEER


def test_major_3_is_refused():
    driver = drive(make_broker(), "mm2")
    driver.feed(vector("V5"))
    (error,) = codec.FrameDecoder().feed(driver.received())
    assert isinstance(error, ErrorFrame)
    assert driver.session.close_reason is CloseReason.PROTOCOL_ERROR


# -- timers on the fake clock ----------------------------------------------------------------------


def test_no_handshake_within_the_login_timeout_closes_without_an_error_frame():
    driver = drive(make_broker(BrokerConfig(auth=("open",), login_timeout=5)), "mm2")
    driver.feed(vector("V1")[:10])
    driver.advance(4.9)
    assert not driver.closed
    driver.advance(0.2)
    assert driver.closed_by == "close"
    assert driver.received() == b""
    assert driver.session.close_reason is CloseReason.LOGIN_TIMEOUT


def test_the_hello_alone_does_not_stop_the_login_timer():
    driver = drive(make_broker(BrokerConfig(auth=("open",), login_timeout=5)), "mm2")
    driver.feed(vector("V1"))
    assert isinstance(codec.HandshakeDecoder().feed(driver.received()), Handshake)
    driver.advance(5)
    assert driver.session.close_reason is CloseReason.LOGIN_TIMEOUT


def test_no_ping_and_no_idle_timeout_a_silent_peer_stays():
    driver = drive(make_broker(BrokerConfig(auth=("open",), keepalive=30)), "mm2")
    driver.feed(vector("V1") + vector("V3"))
    driver.received()
    assert driver.server.keepalive is None
    assert driver.timers.deadline is None  # the login timer is gone; nothing else runs
    for _ in range(24):
        driver.advance(3600)
    assert driver.received() == b""  # Micromessage2 has no ping: nothing is sent
    assert not driver.closed  # and silence proves nothing (TCP keepalive finds dead peers)


def refused(delay, login_timeout=10.0):
    """A connection from an address ``open`` is not allowed for (the default configuration
    allows it on loopback only), past step 3."""
    broker = make_broker(
        BrokerConfig(login_failure_delay=delay, login_timeout=login_timeout)
    )
    driver = drive(broker, "mm2", host="192.0.2.7")
    driver.feed(vector("V1"))
    driver.received()
    return driver


def test_a_refused_login_is_answered_login_failure_delay_late_and_nothing_is_read_meanwhile():
    driver = refused(1.0)
    driver.feed(vector("V3") + frames(MessageFrame(1, "t", b"{}")) + b"\xffgarbage")
    driver.advance(0.99)
    assert driver.received() == b""
    assert not driver.closed
    driver.advance(0.01)
    assert list(codec.FrameDecoder().feed(driver.received())) == [ErrorFrame("login refused")]
    assert driver.closed_by == "close"
    assert driver.session.close_reason is CloseReason.LOGIN_REFUSED
    assert driver.session.close_text == "login refused"


def test_the_login_timeout_does_not_cut_the_late_answer_short():
    driver = refused(1.0, login_timeout=1.5)
    driver.advance(1.0)
    driver.feed(vector("V3"))  # refused at 1.0 s: answered at 2.0 s, past the login timeout
    driver.advance(0.9)
    assert not driver.closed
    driver.advance(0.1)
    assert list(codec.FrameDecoder().feed(driver.received())) == [ErrorFrame("login refused")]
    assert driver.session.close_reason is CloseReason.LOGIN_REFUSED


def test_with_no_delay_the_refusal_is_at_once():
    driver = refused(0)
    driver.feed(vector("V3"))
    assert list(codec.FrameDecoder().feed(driver.received())) == [ErrorFrame("login refused")]
    assert driver.session.close_reason is CloseReason.LOGIN_REFUSED


def test_a_peer_gone_during_the_delay_leaves_no_timer():
    driver = refused(1.0)
    driver.feed(vector("V3"))
    driver.lose()
    assert driver.timers.deadline is None


# -- the window, through the session ------------------------------------------------------------


def logged_in(broker, identity, optional):
    driver = drive(broker, "mm2")
    hello = Handshake(identity, (), codec.parse_extension_list(optional))
    driver.feed(codec.encode_handshake(hello) * 2)
    driver.received()
    return driver, codec.active_extensions(hello)


def test_a_slow_window_is_cut_off_and_closed_on_the_next_tick():
    broker = make_broker(BrokerConfig(auth=("open",), max_backlog=0))
    sub, active = logged_in(broker, "sub", "pubsub;ack")
    sub.feed(frames(codec.encode_pubsub(codec.Subscribe("t"))))
    pub, _ = logged_in(broker, "pub", "pubsub")
    pub.feed(frames(MessageFrame(1, "t", b"1"), MessageFrame(2, "t", b"2")))
    assert [f.seq for f in codec.FrameDecoder().feed(sub.received())] == [1]
    assert not sub.closed  # not during the fan-out
    sub.advance(0)
    assert sub.closed_by == "abort"
    assert sub.session.close_reason is CloseReason.SLOW_CONSUMER
    assert broker.hub.stats.dropped == 1


def test_queue_work_a_lost_member_never_acknowledged_goes_to_another():
    broker = make_broker()
    members = [logged_in(broker, name, "pubsub;ack")[0] for name in ("a", "b")]
    for member in members:
        member.feed(frames(codec.encode_pubsub(codec.Subscribe("jobs", queue="g"))))
    pub, _ = logged_in(broker, "pub", "pubsub")
    pub.feed(frames(MessageFrame(1, "jobs", b"j0"), MessageFrame(2, "jobs", b"j1")))
    a, b = members
    assert [f.payload for f in codec.FrameDecoder().feed(a.received())] == [b"j0"]
    b_frames = codec.FrameDecoder()
    assert [f.payload for f in b_frames.feed(b.received())] == [b"j1"]
    delivered = broker.hub.stats.delivered
    a.lose()  # j0 unacknowledged: it waits for b's window
    assert b.received() == b""
    b.feed(frames(ExtensionFrame(2, (1).to_bytes(2, "big"))))
    assert list(b_frames.feed(b.received())) == [MessageFrame(2, "jobs", b"j0")]
    assert broker.hub.stats.delivered == delivered + 1
