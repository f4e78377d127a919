"""Before login a Micromessage2 connection holds little and tries slowly: a handshake step
(or an ERROR frame sent instead of one) longer than ``prelogin-max-frame`` is refused as
soon as its length fields show it, never buffered; a refused login is answered
``login-failure-delay`` late. The codec byte by byte, the server on a Clock, and real
sockets."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import (
    ErrorFrame,
    Extension,
    Handshake,
    HandshakeDecoder,
    MessageFrame,
    encode_frame,
    encode_handshake,
)
from msgbroker.testing import connect, make_broker
from tests.mm2.support import all_splittings
from tests.mm2.test_codec_fuzz import handshakes
from tests.ssmp.e2e_support import WAIT, parse_address, running_broker

LIMIT = 16 << 10  # BrokerConfig's prelogin_max_frame


def refused_at(data, max_size):
    """The index of the byte whose arrival made the decoder refuse ``data`` fed one byte at a
    time (None: not refused), and whether it gave a message first."""
    decoder = HandshakeDecoder(max_size)
    for index in range(len(data)):
        try:
            if decoder.feed(data[index : index + 1]) is not None:
                return None, True
        except RemoteProtocolError:
            return index, False
    return None, False


def earliest_sign(data, max_size):
    """Where the wire format first shows a handshake must exceed ``max_size``: the byte that
    completes a length field (idlen, reqlen, optlen) after which even empty remaining fields
    would not fit. None if it fits."""
    at = 4 + data[3]
    if at + 4 > max_size:  # identity, then two u16 lengths at least
        return 3
    required_end = at + 2 + int.from_bytes(data[at : at + 2], "big")
    if required_end + 2 > max_size:
        return at + 1
    end = required_end + 2 + int.from_bytes(data[required_end : required_end + 2], "big")
    return required_end + 1 if end > max_size else None


def raw_hello(required=b"", optional=b"", identity=b"hulk"):
    """Step-1 bytes with the lists as given (their lengths written as they are)."""
    return b"".join(
        (bytes((1, 1, 0, len(identity))), identity,
         len(required).to_bytes(2, "big"), required, len(optional).to_bytes(2, "big"), optional)
    )  # fmt: skip


def unknown_extension(size):
    """One unknown (so ignored) optional extension of exactly ``size`` bytes."""
    return b"x-" + b"a" * (size - 2)


# -- the codec ----------------------------------------------------------------------------------


def test_a_declared_list_length_over_the_limit_is_refused_at_its_second_byte():
    hello = encode_handshake(Handshake("hulk", (), ("a" * 100,)))
    head = hello[: 4 + 4 + 2 + 2]  # up to and including the optional list's length
    assert refused_at(hello, 50) == (len(head) - 1, False)
    # not a byte earlier: the required list (empty) fits
    decoder = HandshakeDecoder(50)
    assert decoder.feed(head[:-1]) is None


def test_a_huge_declared_length_is_refused_before_its_bytes_arrive():
    head = bytes((1, 0, 0, 4)) + b"hulk" + b"\xff\xff"  # a 65535-byte required list follows
    decoder = HandshakeDecoder(LIMIT)
    with pytest.raises(RemoteProtocolError, match="at most 16384"):
        decoder.feed(head)


def test_a_handshake_of_exactly_the_limit_is_read_one_byte_more_is_refused():
    hello = encode_handshake(Handshake("hulk", (), (Extension("x-" + "a" * 90),)))
    size = len(hello)
    assert refused_at(hello, size) == (None, True)
    assert refused_at(hello, size - 1) == (11, False)  # the optional list's length's 2nd byte


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(handshakes, st.integers(8, 400))
def test_a_step_over_the_limit_is_refused_as_soon_as_its_lengths_show_it(handshake, max_size):
    data = encode_handshake(handshake)
    expected = earliest_sign(data, max_size)
    assert refused_at(data, max_size) == (expected, expected is None)
    # however the bytes are chunked: refused exactly when the byte-by-byte feed is
    for chunks in list(all_splittings(data))[:40]:
        decoder, raised = HandshakeDecoder(max_size), False
        try:
            for chunk in chunks:
                decoder.feed(chunk)
        except RemoteProtocolError:
            raised = True
        assert raised == (expected is not None)


def test_an_error_frame_instead_of_a_step_is_bounded_too():
    error = encode_frame(ErrorFrame("x" * 300))  # LARGE: 5 bytes of head
    assert HandshakeDecoder(len(error)).feed(error) == ErrorFrame("x" * 300)
    decoder = HandshakeDecoder(len(error) - 1)
    assert decoder.feed(error[:4]) is None
    with pytest.raises(RemoteProtocolError):
        decoder.feed(error[4:5])  # its length is in: refused, the text never read


def test_without_a_limit_the_format_bounds_apply():
    hello = encode_handshake(Handshake("hulk", (), (Extension("x-" + "a" * 20000),)))
    assert isinstance(HandshakeDecoder().feed(hello), Handshake)


# -- the server ---------------------------------------------------------------------------------


@pytest.fixture
def broker():
    return make_broker(BrokerConfig(auth=("open",)))


def test_a_hello_of_exactly_the_limit_is_answered(broker):
    hello = raw_hello(optional=unknown_extension(LIMIT - 12))  # 4 + 4 + 2 + 2 around it
    assert len(hello) == LIMIT
    conn = connect(broker, "mm2")
    conn.send(hello)
    assert isinstance(HandshakeDecoder().feed(conn.received()), Handshake)
    assert not conn.closed


def test_a_hello_one_byte_over_gets_an_error_frame_and_close_when_its_length_arrives(broker):
    hello = raw_hello(optional=unknown_extension(LIMIT - 11))
    optlen_end = 4 + 4 + 2 + 2  # the optional list's length is complete at this byte
    conn = connect(broker, "mm2")
    for index in range(optlen_end - 1):
        conn.send(hello[index : index + 1])
        assert conn.received() == b""
        assert not conn.closed
    conn.send(hello[optlen_end - 1 : optlen_end])
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert error == ErrorFrame(f"handshake of {LIMIT + 1} bytes or more (at most {LIMIT})")
    assert conn.closed
    assert conn.session.close_text.startswith("protocol error: handshake of")


def test_the_confirmation_is_bounded_as_the_hello_is(broker):
    conn = connect(broker, "mm2")
    conn.send(encode_handshake(Handshake("hulk", (), ("pubsub",))))
    conn.received()
    confirm = raw_hello(b"pubsub", unknown_extension(LIMIT))
    conn.send(confirm[:18])  # its lengths only
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert isinstance(error, ErrorFrame)
    assert "at most 16384" in error.text
    assert conn.closed


def test_an_oversized_error_frame_before_the_handshake_is_refused(broker):
    conn = connect(broker, "mm2", host="127.0.0.2")
    conn.send(bytes((0x04 | 0x08,)) + (1 << 20).to_bytes(4, "big"))  # a 1 MiB ERROR declared
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert error == ErrorFrame(f"frame payload of {1 << 20} bytes exceeds {LIMIT - 5}")
    assert conn.closed


def test_the_limit_is_the_configured_one():
    broker = make_broker(BrokerConfig(auth=("open",), prelogin_max_frame=100))
    conn = connect(broker, "mm2")
    conn.send(raw_hello(optional=unknown_extension(89))[:12])  # 101 bytes declared
    (error,) = codec.FrameDecoder().feed(conn.received())
    assert error == ErrorFrame("handshake of 101 bytes or more (at most 100)")


# -- a refused login ----------------------------------------------------------------------------


def refused_client(broker, host="192.0.2.7"):
    """A connection whose login is refused: the default configuration allows ``open`` for
    loopback peers only. Returns it after step 3."""
    conn = connect(broker, "mm2", host=host)
    hello = encode_handshake(Handshake("mallory", (), ("pubsub",)))
    conn.send(hello)
    assert isinstance(HandshakeDecoder().feed(conn.received()), Handshake)
    conn.send(hello)
    return conn


def test_a_refused_login_is_answered_login_failure_delay_late():
    broker = make_broker(BrokerConfig(login_failure_delay=1.0))
    conn = refused_client(broker)
    broker.reactor.advance(0.999)
    assert conn.received() == b""
    assert not conn.closed
    broker.reactor.advance(0.001)
    assert list(codec.FrameDecoder().feed(conn.received())) == [ErrorFrame("login refused")]
    assert conn.closed
    assert conn.session.close_reason == "login refused"


def test_nothing_the_client_sends_meanwhile_is_read():
    broker = make_broker(BrokerConfig(login_failure_delay=1.0))
    conn = refused_client(broker)
    conn.send(encode_frame(MessageFrame(1, "t", b"x")) + b"\xffgarbage")
    assert conn.received() == b""  # no protocol error for the garbage, no ack
    assert not conn.closed
    broker.reactor.advance(1.0)
    assert list(codec.FrameDecoder().feed(conn.received())) == [ErrorFrame("login refused")]


def test_the_login_timeout_does_not_cut_the_delayed_answer_short():
    broker = make_broker(BrokerConfig(login_timeout=1.5, login_failure_delay=1.0))
    conn = connect(broker, "mm2", host="192.0.2.7")
    hello = encode_handshake(Handshake("mallory", (), ("pubsub",)))
    conn.send(hello)
    conn.received()
    broker.reactor.advance(1.0)
    conn.send(hello)  # refused at 1.0 s: answered at 2.0 s, past the 1.5 s login timeout
    broker.reactor.advance(0.9)
    assert not conn.closed
    broker.reactor.advance(0.1)
    assert list(codec.FrameDecoder().feed(conn.received())) == [ErrorFrame("login refused")]
    assert conn.session.close_reason == "login refused"


def test_a_peer_gone_during_the_delay_leaves_no_timer_behind():
    broker = make_broker(BrokerConfig(login_failure_delay=1.0))
    conn = refused_client(broker)
    conn.drop()
    assert broker.reactor.getDelayedCalls() == []


def test_delay_zero_answers_at_once():
    broker = make_broker(BrokerConfig(login_failure_delay=0))
    conn = refused_client(broker)
    assert list(codec.FrameDecoder().feed(conn.received())) == [ErrorFrame("login refused")]
    assert conn.closed


def test_an_accepted_login_is_not_delayed():
    broker = make_broker(BrokerConfig(login_failure_delay=1.0))
    conn = connect(broker, "mm2")  # loopback: open login allowed
    hello = encode_handshake(Handshake("alice", (), ("pubsub",)))
    conn.send(hello)
    conn.received()
    conn.send(hello + encode_frame(MessageFrame(1, "@alice", b"me")))
    assert list(codec.FrameDecoder().feed(conn.received())) == [MessageFrame(1, "@alice", b"me")]


# -- real sockets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    # every Micromessage2 login is refused: the secret scheme alone, which MM2 cannot use
    secret = tmp_path_factory.mktemp("secret") / "secret"
    secret.write_text("s3cret\n")
    with running_broker(
        ("mm2=tcp:0:interface=127.0.0.1",),
        auth=("secret",),
        secret_file=str(secret),
        login_failure_delay=0.2,
    ) as broker:
        yield broker


def read_to_close(sock):
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def mm2_port(running):
    return parse_address(running.service.broker.listening[0][1])[1]


def test_e2e_an_oversized_hello_is_refused_from_its_head_alone(running):
    with socket.create_connection(("127.0.0.1", mm2_port(running)), timeout=WAIT) as sock:
        # the head of a hello announcing a 65535-byte required list; the list never comes
        sock.sendall(bytes((1, 0, 0, 4)) + b"hulk" + b"\xff\xff")
        (error,) = codec.FrameDecoder().feed(read_to_close(sock))
    assert error == ErrorFrame(
        f"handshake of {4 + 4 + 2 + 65535 + 2} bytes or more (at most {LIMIT})"
    )


def test_e2e_a_refused_login_gets_its_error_frame_then_the_close(running):
    with socket.create_connection(("127.0.0.1", mm2_port(running)), timeout=WAIT) as sock:
        hello = encode_handshake(Handshake("mallory", (), ("pubsub",)))
        sock.sendall(hello)
        decoder = HandshakeDecoder()
        while (reply := decoder.feed(sock.recv(65536))) is None:
            pass
        assert isinstance(reply, Handshake)
        sock.sendall(hello)
        received = decoder.trailing_data + read_to_close(sock)
    assert list(codec.FrameDecoder().feed(received)) == [ErrorFrame("login refused")]
