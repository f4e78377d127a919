"""The broker's limits as STMP meets them: a subscribe over ``max-subscriptions`` or
``max-topics`` is refused with ``0x23`` Forbidden saying which limit, the connection stays
open; the WebSocket listener is held to the connection limits like the TCP one (from the
TCP connection on, handshake included); a slow consumer is closed through its session,
reason ``"slow consumer"``, over TCP and WebSocket alike."""

from __future__ import annotations

import contextlib
import socket

import pytest
from twisted.internet.address import IPv4Address

from msgbroker import BrokerConfig, Listener
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from msgbroker.plugins.stmp.codec import Encoding, Response, Status
from msgbroker.testing import connect, make_broker
from tests.ssmp.e2e_support import running_broker
from tests.stmp.raw_support import (
    TEXT,
    RawWebSocket,
    ended,
    flood_past_a_stalled_reader,
    handshake_head,
    request,
    text_request,
)

LOGIN = {"scheme": "open"}


def logged_in(broker, identity):
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", {"id": identity, **LOGIN}))
    assert conn.received() == codec.encode_binary(Response(1, Status.OK))
    return conn


def replies(conn):
    return list(codec.BinaryDecoder().feed(conn.received()))


def forbidden(ident, limit):
    payload = b'{"error":"%s reached"}' % limit.encode()
    return Response(ident, Status.FORBIDDEN, Encoding.JSON, payload)


def test_a_subscribe_over_max_subscriptions_is_forbidden_and_the_connection_stays():
    broker = make_broker(BrokerConfig(auth=("open",), max_subscriptions=2))
    conn = logged_in(broker, "alice")
    conn.send(
        request(2, "0.0.1.2", {"topic": "a"})
        + request(3, "0.0.1.2", {"topic": "b"})
        + request(4, "0.0.1.2", {"topic": "c"})
        + request(5, "0.0.1.3", {"topic": "a"})
        + request(6, "0.0.1.2", {"topic": "c"})
    )
    assert replies(conn) == [
        Response(2, Status.OK),
        Response(3, Status.OK),
        forbidden(4, "max-subscriptions"),
        Response(5, Status.OK),
        Response(6, Status.OK),
    ]
    assert not conn.closed
    assert broker.hub.stats.refused == 1


def test_a_subscribe_over_max_topics_is_forbidden_and_others_are_unaffected():
    broker = make_broker(BrokerConfig(auth=("open",), max_topics=1))
    alice, bob = logged_in(broker, "alice"), logged_in(broker, "bob")
    alice.send(request(2, "0.0.1.2", {"topic": "one"}))
    bob.send(request(2, "0.0.1.2", {"topic": "two"}) + request(3, "0.0.1.2", {"topic": "one"}))
    assert replies(alice) == [Response(2, Status.OK)]
    assert replies(bob) == [forbidden(2, "max-topics"), Response(3, Status.OK)]
    assert not bob.closed


def test_a_websocket_connection_in_its_handshake_counts_against_max_connections():
    broker = make_broker(BrokerConfig(auth=("open",), max_connections=1))
    first = connect(broker, "stmp-ws")  # TCP connected, no handshake yet
    assert first.session in broker.sessions
    factory = broker.protocols["stmp-ws"].build_factory(broker, Listener("stmp-ws", "tcp:0"))
    assert factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001)) is None
    first.drop()
    assert factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40002)) is not None


def test_a_handshake_that_never_ends_is_closed_at_the_login_timeout():
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=3.0))
    conn = connect(broker, "stmp-ws")
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n")
    broker.reactor.advance(2.9)
    assert not conn.closed
    broker.reactor.advance(0.1)
    assert conn.closed and conn.session.close_reason == "login timeout"
    assert broker.sessions == {}


def test_the_websocket_listener_refuses_connections_over_max_connections():
    with running_broker(
        ("stmp-ws=tcp:0:interface=127.0.0.1",), auth=("open",), max_connections=1
    ) as broker:
        with BlockingSTMPClient(broker.host, broker.port, "first", ws=True) as first:
            refused = socket.create_connection((broker.host, broker.port), timeout=10)
            answer = b""
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                refused.sendall(handshake_head())
                answer = refused.recv(4096)
            assert answer == b""  # closed at once: no HTTP answer at all
            refused.close()
            first.subscribe("still-served")


# -- slow consumers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker():
    with running_broker(
        ("stmp=tcp:0:interface=127.0.0.1", "stmp-ws=tcp:0:interface=127.0.0.1"),
        auth=("open",),
        max_backlog=64 * 1024,
    ) as running:
        yield running


def port(broker, index):
    return int(broker.service.broker.listening[index][1].rsplit(":", 1)[1])


def session_of(broker, identity):
    def find():
        return next(s for s in broker.service.broker.sessions if s.identity == identity)

    return broker.call(find)


def stalled_tcp(broker, identity, topic):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port(broker, 0)))
    sock.sendall(
        request(1, "0.0.1.1", {"id": identity, **LOGIN}) + request(2, "0.0.1.2", {"topic": topic})
    )
    decoder, got = codec.BinaryDecoder(), []
    while len(got) < 2:
        got.extend(decoder.feed(sock.recv(4096)))
    return sock


def stalled_ws(broker, identity, topic):
    ws = RawWebSocket(port(broker, 1), rcvbuf=4096)
    ws.sock.settimeout(30)
    ws.send(TEXT, text_request(1, "0.0.1.1", {"id": identity, **LOGIN}))
    ws.send(TEXT, text_request(2, "0.0.1.2", {"topic": topic}))
    assert [ws.frame(), ws.frame()] == [(TEXT, b"3|0|1|0"), (TEXT, b"3|0|2|0")]
    return ws.sock


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_a_slow_consumer_is_closed_through_its_session(broker, transport):
    identity, topic = f"stalled-{transport}", f"flood-{transport}"
    stalled = (stalled_tcp if transport == "tcp" else stalled_ws)(broker, identity, topic)
    session = session_of(broker, identity)
    payload, count = b"y" * 4000, 2000  # ~8 MB: past the kernel and the budget
    received = flood_past_a_stalled_reader(port(broker, 0), topic, count, payload)
    assert len(received) == count  # the others never waited for the slow one
    assert ended(stalled)
    stalled.close()
    assert session.close_reason == "slow consumer"
    assert broker.call(lambda: session in broker.service.broker.sessions) is False
