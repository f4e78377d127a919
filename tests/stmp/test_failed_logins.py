"""Failed STMP logins: the Unauthorized reply comes ``login-failure-delay`` seconds late,
and what was pipelined after the login waits for it (requests take effect in order), so
one connection tries one login per delay, and the broker's per-address throttle bounds the
credentials checked for all of them together. On a Clock, then over real sockets."""

from __future__ import annotations

import socket
import time

import pytest

from msgbroker import BrokerConfig, hookimpl
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.codec import Encoding, Response, Status
from msgbroker.plugins.stmp.payloads import decode_payload
from msgbroker.testing import connect, make_broker
from tests.interop.peers import ws_client_frame
from tests.ssmp.e2e_support import running_broker
from tests.stmp.raw_support import TEXT, RawWebSocket, request, server_frames, text_request, ws_open

DELAY = 1.0
WRONG = {"id": "mallory", "scheme": "kerberos"}  # a scheme the broker does not offer
RIGHT = {"id": "alice", "scheme": "open"}
VERSION_CHECK = codec.encode_binary(codec.Request(0, 0, Encoding.RAW, b"\x01"))


class Attempts:
    """Counts login attempts (every one) and credential checks (those the throttle let
    through to the schemes)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.checked = 0

    @hookimpl
    def msgbroker_session_login(self, session, request, result):
        self.attempts += 1

    @hookimpl
    def msgbroker_authenticate(self, request):
        self.checked += 1


def broker_with(attempts=None, **config):
    settings = {"auth": ("open",), "login_failure_delay": DELAY, **config}
    return make_broker(BrokerConfig(**settings), plugins=[attempts] if attempts else [])


def replies(conn):
    return list(codec.BinaryDecoder().feed(conn.received()))


def test_a_refused_login_is_answered_after_the_delay_and_the_connection_stays_open():
    broker = broker_with()
    conn = connect(broker, "stmp")
    conn.send(request(7, "0.0.1.1", WRONG))
    broker.reactor.advance(DELAY - 0.001)
    assert conn.received() == b""
    broker.reactor.advance(0.001)
    (reply,) = replies(conn)
    assert (reply.id, reply.status) == (7, Status.UNAUTHORIZED)
    assert decode_payload(reply.payload, reply.encoding) == {"schemes": ["open"]}
    conn.send(request(8, "0.0.1.1", RIGHT))  # and may try again
    assert replies(conn) == [Response(8, Status.OK)]


def test_what_follows_a_refused_login_waits_for_it_in_order():
    broker = broker_with()
    conn = connect(broker, "stmp")
    conn.send(
        request(1, "0.0.1.1", WRONG)
        + VERSION_CHECK
        + request(2, "0.0.1.1", WRONG)
        + request(3, "0.0.1.1", RIGHT)
        + request(4, "0.0.1.2", {"topic": "t"})
    )
    assert conn.received() == b""  # even the version check waits behind the login
    assert conn.transport.producerState == "paused"  # and the socket is not read meanwhile
    broker.reactor.advance(DELAY)
    assert replies(conn) == [
        Response(1, Status.UNAUTHORIZED, Encoding.JSON, b'{"schemes":["open"]}'),
        Response(0, Status.OK, Encoding.RAW, b"\x01"),
    ]
    assert conn.transport.producerState == "paused"  # the second wrong login holds it again
    broker.reactor.advance(DELAY)
    assert [(r.id, r.status) for r in replies(conn)] == [
        (2, Status.UNAUTHORIZED),
        (3, Status.OK),
        (4, Status.OK),
    ]
    assert conn.transport.producerState == "producing"
    assert conn.session.identity == "alice"


def test_bytes_arriving_while_held_wait_too():
    broker = broker_with()
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", WRONG) + request(2, "0.0.1.1", RIGHT)[:5])
    conn.send(request(2, "0.0.1.1", RIGHT)[5:])  # (TLS can hand over more after a pause)
    conn.send(request(3, "0.0.1.2", {"topic": "t"}))
    assert conn.received() == b""
    broker.reactor.advance(DELAY)
    assert [(r.id, r.status) for r in replies(conn)] == [
        (1, Status.UNAUTHORIZED),
        (2, Status.OK),
        (3, Status.OK),
    ]


def test_one_connection_tries_one_login_per_delay():
    attempts = Attempts()
    broker = broker_with(attempts)
    conn = connect(broker, "stmp")
    conn.send(b"".join(request(i, "0.0.1.1", WRONG) for i in range(1, 101)))
    assert attempts.attempts == 1
    for second in range(1, 6):
        broker.reactor.advance(DELAY)
        assert attempts.attempts == second + 1
        assert [r.id for r in replies(conn)] == [second]


def test_many_connections_from_one_address_are_bounded_by_the_throttle():
    attempts = Attempts()
    broker = broker_with(attempts, login_attempts=2.0)
    conns = [connect(broker, "stmp", port=40000 + i) for i in range(20)]
    for conn in conns:
        conn.send(b"".join(request(i, "0.0.1.1", WRONG) for i in range(1, 30)))
    for _ in range(9):  # (the login timeout, 10 s, closes them all at 10 s)
        broker.reactor.advance(DELAY)
    # each connection: one attempt per delay (1 at 0 s, 9 more in 9 s)
    assert attempts.attempts == 20 * 10
    # the schemes saw at most the throttle's rate (2/s over 9 s) and its burst (2)
    assert attempts.checked <= 2 * 9 + 2
    assert all(not conn.closed for conn in conns)


def test_a_connection_lost_while_held_gets_nothing_and_leaves_no_timer():
    broker = broker_with()
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", WRONG) + request(2, "0.0.1.1", RIGHT))
    conn.drop()
    broker.reactor.advance(DELAY)
    assert conn.received() == b""
    assert broker.reactor.getDelayedCalls() == []
    assert broker.sessions == {}


def test_the_login_timeout_still_closes_a_held_connection():
    broker = broker_with(login_timeout=DELAY / 2)
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", WRONG) + request(2, "0.0.1.1", RIGHT))
    broker.reactor.advance(DELAY / 2)
    assert conn.closed and conn.session.close_reason == "login timeout"
    broker.reactor.advance(DELAY)
    assert conn.received() == b""


def test_no_delay_answers_at_once():
    broker = broker_with(login_failure_delay=0.0)
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", WRONG) + request(2, "0.0.1.1", RIGHT))
    assert [(r.id, r.status) for r in replies(conn)] == [
        (1, Status.UNAUTHORIZED),
        (2, Status.OK),
    ]


def test_over_websocket_what_follows_waits_in_order_too():
    broker = broker_with()
    conn = connect(broker, "stmp-ws")
    ws_open(conn)
    conn.send(
        ws_client_frame(TEXT, text_request(1, "0.0.1.1", WRONG))
        + ws_client_frame(TEXT, b"1|5|0|0|01")  # the version check, in text
        + ws_client_frame(TEXT, text_request(2, "0.0.1.1", RIGHT))
    )
    assert conn.received() == b""
    broker.reactor.advance(DELAY)
    assert server_frames(conn.received()) == [
        (TEXT, b'3|2|1|33|{"schemes":["open"]}'),
        (TEXT, b"3|5|0|0|01"),
        (TEXT, b"3|0|2|0"),
    ]


# -- real sockets ------------------------------------------------------------------------------

N, E2E_DELAY = 5, 0.05


@pytest.fixture(scope="module")
def broker():
    with running_broker(
        ("stmp=tcp:0:interface=127.0.0.1", "stmp-ws=tcp:0:interface=127.0.0.1"),
        auth=("open",),
        login_failure_delay=E2E_DELAY,
        login_attempts=0.0,  # this test is about one connection's pace, not the throttle
    ) as running:
        yield running


def port(broker, index):
    return int(broker.service.broker.listening[index][1].rsplit(":", 1)[1])


def test_pipelined_wrong_logins_over_tcp_are_answered_one_per_delay_in_order(broker):
    sock = socket.create_connection(("127.0.0.1", port(broker, 0)), timeout=10)
    started = time.monotonic()
    sock.sendall(
        b"".join(request(i, "0.0.1.1", WRONG) for i in range(1, N + 1))
        + request(N + 1, "0.0.1.1", RIGHT)
        + request(N + 2, "0.0.1.2", {"topic": "t"})
    )
    decoder, got = codec.BinaryDecoder(), []
    while len(got) < N + 2:
        chunk = sock.recv(4096)
        assert chunk, got
        got.extend(decoder.feed(chunk))
    elapsed = time.monotonic() - started
    sock.close()
    refused = [(i, Status.UNAUTHORIZED) for i in range(1, N + 1)]
    assert [(r.id, r.status) for r in got] == [*refused, (N + 1, Status.OK), (N + 2, Status.OK)]
    # a lower bound only (the replies cannot come sooner); the exact pace is on the Clock
    assert elapsed >= N * E2E_DELAY * 0.9


def test_pipelined_wrong_logins_over_websocket_are_answered_in_order(broker):
    ws = RawWebSocket(port(broker, 1))
    try:
        frames = [text_request(i, "0.0.1.1", WRONG) for i in range(1, N + 1)]
        started = time.monotonic()
        ws.sock.sendall(b"".join(ws_client_frame(TEXT, f) for f in frames))
        ws.send(TEXT, text_request(N + 1, "0.0.1.1", RIGHT))
        got = [ws.frame() for _ in range(N + 1)]
        elapsed = time.monotonic() - started
    finally:
        ws.close()
    assert elapsed >= N * E2E_DELAY * 0.9  # a lower bound only, as over TCP
    assert got == [(TEXT, b'3|2|%d|33|{"schemes":["open"]}' % i) for i in range(1, N + 1)] + [
        (TEXT, b"3|0|%d|0" % (N + 1))
    ]
