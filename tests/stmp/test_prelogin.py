"""What an unauthenticated STMP peer can make the broker hold: at most ``prelogin-max-frame``
bytes per message (TCP) or WebSocket message, and per WebSocket request head, refused from
the header that declares more (never buffered); after login the usual 16 MiB applies. A
head trickling in byte by byte is searched once, not once per byte."""

from __future__ import annotations

import itertools
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from msgbroker.plugins.stmp.codec import Encoding, Request, Response, Status
from msgbroker.testing import connect, make_broker
from tests.interop.peers import ws_client_frame
from tests.ssmp.e2e_support import running_broker
from tests.stmp.raw_support import (
    CLOSE,
    TEXT,
    RawWebSocket,
    ended,
    handshake_head,
    request,
    server_frames,
    text_request,
    ws_open,
)

LIMIT = 256
LOGIN = {"id": "alice", "scheme": "open"}


def limited_broker(limit: int = LIMIT):
    return make_broker(BrokerConfig(auth=("open",), prelogin_max_frame=limit))


def replies(conn):
    return list(codec.BinaryDecoder().feed(conn.received()))


def sized_login(ident: int, size: int) -> bytes:
    """A login request of exactly ``size`` bytes (padded with a field logins ignore)."""
    bare = request(ident, "0.0.1.1", {**LOGIN, "pad": ""})
    return request(ident, "0.0.1.1", {**LOGIN, "pad": "p" * (size - len(bare))})


# -- TCP ---------------------------------------------------------------------------------------


def test_before_login_a_declared_size_over_the_limit_closes_at_its_header():
    broker = limited_broker()
    conn = connect(broker, "stmp")
    # a publish header declaring 16 MiB: nothing of the payload has been sent
    conn.send(b"\x50\x00\x01\x00\x00\x01\x04" + (16 << 20).to_bytes(4, "big"))
    assert conn.closed
    size = (16 << 20) + 11
    assert conn.session.close_text == f"protocol error: message of {size} bytes exceeds {LIMIT}"
    assert conn.received() == b""  # a protocol error gets no STMP answer


@pytest.mark.parametrize(("size", "refused"), [(LIMIT, False), (LIMIT + 1, True)])
def test_the_limit_counts_the_whole_message(size, refused):
    broker = limited_broker()
    conn = connect(broker, "stmp")
    message = sized_login(1, size)
    assert len(message) == size
    conn.send(message[:11])  # header, id, action and PS: the size is known here
    assert conn.closed is refused
    conn.send(message[11:])
    assert replies(conn) == ([] if refused else [Response(1, Status.OK)])


def test_after_login_larger_messages_are_accepted_even_in_the_same_write():
    broker = limited_broker()
    conn = connect(broker, "stmp")
    big = {"topic": "t", "data": "x" * (4 * LIMIT)}
    conn.send(request(1, "0.0.1.1", LOGIN) + request(2, "0.0.1.4", big))
    conn.send(request(3, "0.0.1.4", big) * 3)  # a run of them, on the fast path
    assert [r.status for r in replies(conn)] == [Status.OK] * 5
    assert not conn.closed


def test_a_refused_login_keeps_the_limit():
    broker = limited_broker()
    conn = connect(broker, "stmp")
    conn.send(request(1, "0.0.1.1", {"id": "a", "scheme": "nope"}))
    broker.reactor.advance(broker.config.login_failure_delay)
    assert [r.status for r in replies(conn)] == [Status.UNAUTHORIZED]
    conn.send(sized_login(2, LIMIT + 1)[:11])
    assert conn.closed


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(min_value=12, max_value=200),
    sizes=st.lists(st.integers(min_value=0, max_value=220), min_size=2, max_size=6),
)
def test_the_decoder_refuses_the_first_message_over_max_message_runs_included(limit, sizes):
    # one header byte and action throughout, so feed_runs makes runs of them
    stream = b"".join(
        codec.encode_binary(Request(i, 5, Encoding.RAW, b"r" * size))
        for i, size in enumerate(sizes)
    )
    fitting = list(itertools.takewhile(lambda size: size + 11 <= limit, sizes))
    for runs in (False, True):
        decoder = codec.BinaryDecoder(max_message=limit)
        got: list[codec.Message] = []
        try:
            for message in (decoder.feed_runs if runs else decoder.feed)(stream):
                got.extend(codec.expand_runs([message]))
        except RemoteProtocolError:
            assert len(fitting) < len(sizes)
        else:
            assert fitting == sizes
        assert [len(r.payload) for r in got] == fitting  # type: ignore[union-attr]


def test_over_tcp_the_header_alone_is_answered_by_a_close():
    with running_broker(("stmp=tcp:0:interface=127.0.0.1",), auth=("open",)) as broker:
        sock = socket.create_connection((broker.host, broker.port), timeout=10)
        sock.sendall(b"\x50\x00\x01\x00\x00\x01\x04" + (16 << 20).to_bytes(4, "big"))
        assert sock.recv(100) == b""  # closed, without waiting for the 16 MiB
        sock.close()
        with BlockingSTMPClient(broker.host, broker.port, "after") as client:
            client.publish("t", b"x" * (64 << 10))  # after login: 64 KiB is fine


# -- WebSocket: messages -----------------------------------------------------------------------


def test_before_login_a_websocket_message_over_the_limit_is_refused_at_its_frame_header():
    broker = limited_broker()
    conn = connect(broker, "stmp-ws")
    ws_open(conn)
    frame = ws_client_frame(TEXT, b"2|5|9|" + b"x" * 500)
    conn.send(frame[:8])  # the frame header (2 + 2 bytes of length + 4 of mask)
    assert server_frames(conn.received()) == [
        (CLOSE, (1009).to_bytes(2, "big") + f"protocol error: message over {LIMIT} bytes".encode())
    ]
    assert conn.session.close_text == f"protocol error: message over {LIMIT} bytes"
    assert conn.session not in broker.sessions


def test_after_a_websocket_login_larger_messages_are_accepted():
    broker = limited_broker()
    conn = connect(broker, "stmp-ws")
    ws_open(conn)
    big = {"topic": "t", "data": "x" * (4 * LIMIT)}
    conn.send(
        ws_client_frame(TEXT, text_request(1, "0.0.1.1", LOGIN))
        + ws_client_frame(TEXT, text_request(2, "0.0.1.4", big))
    )
    assert server_frames(conn.received()) == [(TEXT, b"3|0|1|0"), (TEXT, b"3|0|2|0")]


def test_over_websocket_the_frame_header_alone_is_answered_by_a_close_1009(request):
    with running_broker(("stmp-ws=tcp:0:interface=127.0.0.1",), auth=("open",)) as broker:
        ws = RawWebSocket(broker.port)
        request.addfinalizer(ws.close)
        # a binary frame header declaring 1 MiB, then nothing: refused all the same
        ws.sock.sendall(b"\x82\xff" + (1 << 20).to_bytes(8, "big") + b"mask")
        opcode, payload = ws.frame()
        assert (opcode, payload[:2]) == (CLOSE, (1009).to_bytes(2, "big"))
        with BlockingSTMPClient(broker.host, broker.port, "after", ws=True) as client:
            client.publish("t", b"x" * (64 << 10))  # after login: 64 KiB is fine


# -- WebSocket: the request head ---------------------------------------------------------------


@pytest.mark.parametrize(("extra", "accepted"), [(0, True), (1, False)])
def test_a_request_head_may_be_exactly_the_limit(extra, accepted):
    broker = limited_broker(1024)
    conn = connect(broker, "stmp-ws")
    bare = len(handshake_head())
    head = handshake_head(pad=1024 - bare + extra)
    assert len(head) == 1024 + extra
    conn.send(head)
    response = conn.received()
    if accepted:
        assert response.startswith(b"HTTP/1.1 101")
        assert not conn.closed
    else:
        assert response == b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n"
        assert conn.closed
        assert conn.session.close_text == "protocol error: request head over 1024 bytes"


def test_endless_headers_are_cut_at_the_limit_byte_by_byte():
    broker = limited_broker(1024)
    conn = connect(broker, "stmp-ws")
    endless = b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 200
    for i in range(1024):
        conn.send(endless[i : i + 1])
    assert not conn.closed and conn.received() == b""
    conn.send(endless[1024:1025])
    assert conn.closed
    assert conn.received().startswith(b"HTTP/1.1 431 ")


def test_a_head_trickling_in_is_searched_once(monkeypatch):
    broker = limited_broker(16 << 10)
    conn = connect(broker, "stmp-ws")
    proto = conn.protocol
    calls = []
    parse = proto.processHandshake

    def counted():
        calls.append(len(proto.data))
        return parse()

    monkeypatch.setattr(proto, "processHandshake", counted)
    head = handshake_head(pad=15 << 10)
    for i in range(len(head)):  # one byte per read, CRLFs split across reads
        conn.send(head[i : i + 1])
    assert conn.received().startswith(b"HTTP/1.1 101")
    assert calls == [len(head)]  # autobahn parsed (and scanned) the head once, whole


def test_bytes_after_the_head_in_the_same_read_are_frames():
    broker = limited_broker()
    conn = connect(broker, "stmp-ws")
    conn.send(handshake_head() + ws_client_frame(TEXT, text_request(1, "0.0.1.1", LOGIN)))
    head, _, rest = conn.received().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    assert server_frames(rest) == [(TEXT, b"3|0|1|0")]


def test_over_a_real_socket_a_head_over_the_limit_gets_431(request):
    with running_broker(("stmp-ws=tcp:0:interface=127.0.0.1",), auth=("open",)) as broker:
        limit = broker.service.broker.config.prelogin_max_frame
        sock = socket.create_connection((broker.host, broker.port), timeout=10)
        request.addfinalizer(sock.close)
        # one byte over the limit and no end of head; exactly that, so that the broker has
        # read everything when it closes (unread bytes would turn its close into a reset)
        endless = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: "
        sock.sendall(endless + b"p" * (limit + 1 - len(endless)))
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = sock.recv(4096)
            assert chunk, response
            response += chunk
        assert response.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        assert ended(sock)
        with BlockingSTMPClient(broker.host, broker.port, "after", ws=True) as client:
            client.subscribe("t")  # the listener is fine
