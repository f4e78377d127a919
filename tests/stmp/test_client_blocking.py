"""The blocking client (:class:`BlockingSTMPClient`) over real sockets: against the fake
server, and in the ``# real broker:`` tests against a real broker too, over TCP and
WebSocket; calls, local timeouts and late replies, refused versions and logins, notifies,
the heartbeat (also driven by an injected clock), the WebSocket wire format, TLS, refused
connections; and the client's own WebSocket pieces (masking, framing, the frame reader).
The fake and the targets are in ``client_support.py``.
"""

from __future__ import annotations

import socket
import time

import msgpack
import pytest

from msgbroker.clientkit.websocket import WebSocketReader, ws_frame, ws_mask
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.client import (
    BlockingSTMPClient,
    Delivery,
    STMPConnectionClosed,
    STMPError,
)
from msgbroker.plugins.stmp.codec import Notify, Ping, Request, Status, encode_binary
from tests.ssmp.e2e_support import WAIT
from tests.stmp.client_support import (
    DELAY,
    ECHO,
    JSON,
    MSGPACK,
    NOTIFY_BACK,
    RAW,
    SILENT,
    STATUS,
    FakeSTMPServer,
    blocking_client,
    renaming_login,
)


# real broker: the blocking client's broker actions and deliveries
@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_blocking_publish_unicast_broadcast(target, encoding):
    with blocking_client(target, identity="bob", encoding=encoding) as bob, \
            blocking_client(target, identity="alice", encoding=encoding) as alice:  # fmt: skip
        assert bob.stmp_version == (0, 1) and bob.identity == "bob"
        bob.subscribe("news")
        alice.broadcast(b"no shared topic yet")  # Ok, and reaches nobody (else bob's first)
        alice.subscribe("news")
        alice.publish("news", b"a | b")
        alice.publish("news", b"\xff\x00")
        alice.unicast("bob", b"u")
        alice.broadcast(b"b")
        got = [bob.next_delivery(WAIT) for _ in range(4)]
        assert got == [
            Delivery("alice", "mcast", "news", b"a | b"),
            Delivery("alice", "mcast", "news", b"\xff\x00"),
            Delivery("alice", "ucast", None, b"u"),
            Delivery("alice", "bcast", None, b"b"),
        ]
        assert bob.next_delivery(0) is None
        with pytest.raises(STMPError) as info:
            alice.unicast("nobody", b"x")
        assert info.value.status == Status.NOT_FOUND
        bob.unsubscribe("news")
        with pytest.raises(STMPError):
            bob.unsubscribe("news")


def test_blocking_call_and_request(server):
    with blocking_client(server, identity="alice") as client:
        assert client.call(ECHO, {"x": [1, "|"]}) == {"x": [1, "|"]}
        assert client.request("1.0.0.1", b"\x00|\xff").payload == b"\x00|\xff"
        with pytest.raises(STMPError) as info:
            client.call(STATUS, {"status": 0x99})
        assert info.value.status == 0x99 and info.value.payload == {"why": "asked"}
        assert str(info.value) == '0x99 status 0x99: {"why": "asked"}'
        assert client.request("9.9.9.9").status == Status.NOT_FOUND


def test_blocking_timeout_is_a_local_0x25_and_the_late_reply_is_dropped(server):
    with blocking_client(server, identity="alice") as client:
        started = time.monotonic()
        response = client.request(DELAY, {"delay": 0.5}, timeout=0.2)
        assert response.status == Status.REQUEST_TIMEOUT and response.payload == b""
        assert time.monotonic() - started < 0.5
        with pytest.raises(STMPError) as info:
            client.call(SILENT, timeout=0.5)  # the late reply arrives while waiting
        assert info.value.local
        assert client.late_replies == 1
        assert client.call(ECHO, 5) == 5  # ids moved on; the connection is fine


def test_blocking_version_refused(thread, server):
    server.versions = ((1, 0),)
    with pytest.raises(STMPError) as info:
        blocking_client(server, identity="alice")
    assert info.value.status == Status.VERSION_NOT_SUPPORTED
    assert server.requests(payloads.LOGIN) == []


def test_blocking_login_refused(thread):
    with FakeSTMPServer(thread, secret="pw") as server:
        with pytest.raises(STMPError) as info:
            blocking_client(server, identity="alice", scheme="secret", credential=b"wrong")
        assert info.value.payload == {"schemes": ["secret"]}
        with blocking_client(server, identity="alice", scheme="secret", credential="pw") as ok:
            assert ok.identity == "alice"


def test_blocking_without_identity_only_checks_the_version(server):
    with blocking_client(server) as client:
        assert client.identity is None and client.stmp_version == (0, 1)
        client.login("later")
        assert client.identity == "later"
    assert server.requests(payloads.LOGIN)[0].payload == b'{"id":"later","scheme":"open"}'


def test_blocking_notifies_are_queued_apart_from_deliveries(server):
    with blocking_client(server, identity="alice") as client:
        client.call(NOTIFY_BACK, "n")
        assert client.next_delivery(0) is None
        assert client.next_notify(WAIT) == Notify(NOTIFY_BACK, JSON, b'"n"')


def test_blocking_heartbeat(thread):
    with FakeSTMPServer(thread, ping_every=0.1) as server:
        with blocking_client(server, identity="alice", heartbeat=0.1) as client:
            assert client.next_delivery(0.5) is None
            assert client.pings_received >= 2
            server.wait(lambda: len(server.logged(Ping)) >= 2)


def test_blocking_gives_up_on_a_silent_server(server):
    with blocking_client(server, identity="alice", heartbeat=0.1) as client:
        started = time.monotonic()
        with pytest.raises(STMPConnectionClosed, match="nothing from the server"):
            client.next_delivery(5)
        assert time.monotonic() - started < 2


def test_blocking_poll_keeps_the_heartbeat_without_waiting(tcp_server):
    now = [1000.0]
    with blocking_client(
        tcp_server, identity="alice", heartbeat=30, clock=lambda: now[0]
    ) as client:
        client.poll()
        client.subscribe("after-the-first-poll")  # anything sent before it has arrived
        assert tcp_server.logged(Ping) == []  # no interval had passed
        now[0] += 30.5  # one heartbeat interval, with nothing received
        client.poll()
        tcp_server.wait(lambda: len(tcp_server.logged(Ping)) >= 1)


def test_blocking_server_closing_is_connection_closed(server):
    client = blocking_client(server, identity="alice")
    server.thread.call(server.connections[0].drop)
    with pytest.raises(STMPConnectionClosed):
        client.next_delivery(WAIT)
    with pytest.raises(STMPConnectionClosed):
        client.publish("t", b"x")
    client.close()  # never raises


def test_blocking_ws_wire_format(ws_server):
    with blocking_client(ws_server, identity="alice", encoding=MSGPACK) as client:
        assert ws_server.frames[0] == (False, b"1|5|0|0|01")
        client.call(ECHO, "x|y", encoding=JSON)
        assert (False, b'1|2|2|16777217|"x|y"') in ws_server.frames
        client.publish("t", b"\x00")  # msgpack: header, then the payload frame
        header = next(f for f in ws_server.frames if f[1].startswith(b"1|3|3|"))
        after = ws_server.frames[ws_server.frames.index(header) + 1]
        assert header == (False, b"1|3|3|260") and after[0] is True
        assert msgpack.unpackb(after[1]) == {"topic": "t", "data": b"\x00"}


def test_blocking_ws_version_reply_in_two_frames_is_accepted(thread):
    with FakeSTMPServer(thread, ws=True, version_inline=False) as server:
        with blocking_client(server, identity="alice") as client:
            assert client.stmp_version == (0, 1)


def test_blocking_ws_binary_frames(ws_server):
    with blocking_client(ws_server, identity="alice", binary_frames=True) as client:
        assert client.call(ECHO, {"k": "|"}) == {"k": "|"}
        assert ws_server.frames[0] == (True, encode_binary(Request(0, 0, RAW, b"\x01"), False))


def test_blocking_ws_close_is_a_clean_close_handshake(ws_server):
    client = blocking_client(ws_server, identity="alice")
    client.close()
    assert ws_server.wait(lambda: ws_server.ended(0))
    assert client.closed


@pytest.mark.parametrize("ws", [False, True], ids=["tls", "wss"])
def test_blocking_over_tls(thread, pki, tls_context, ws):
    import ssl

    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with FakeSTMPServer(thread, ws=ws, tls=tls_context) as server:
        with BlockingSTMPClient("127.0.0.1", server.port, "al", ws=ws, ssl_context=context) as c:
            assert c.call(ECHO, "over tls") == "over tls"


def test_blocking_refused_connection():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        BlockingSTMPClient("127.0.0.1", port, "alice")


def test_blocking_ws_handshake_refused(tcp_server):
    # a TCP STMP server does not speak HTTP: it sees garbage and drops us
    with pytest.raises((STMPConnectionClosed, OSError)):
        BlockingSTMPClient("127.0.0.1", tcp_server.port, "alice", ws=True, timeout=3)


def test_blocking_login_answered_with_another_identity_takes_that_identity(thread):
    with FakeSTMPServer(thread) as server:
        server.behaviour[payloads.LOGIN] = renaming_login
        with blocking_client(server, identity="alice") as client:
            assert client.identity == "ALICE"


# -- the blocking client's WebSocket pieces ----------------------------------------------------


def server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 65536:
        return head + b"\x7e" + n.to_bytes(2, "big") + payload
    return head + b"\x7f" + n.to_bytes(8, "big") + payload


def test_ws_mask_is_its_own_inverse_and_matches_the_rfc_example():
    # RFC 6455 5.7: "Hello" masked with 37 fa 21 3d
    key = bytes.fromhex("37fa213d")
    assert ws_mask(b"Hello", key) == bytes.fromhex("7f9f4d5158")
    assert ws_mask(ws_mask(b"x" * 1001, key), key) == b"x" * 1001
    assert ws_frame(1, b"Hello", key) == bytes.fromhex("818537fa213d7f9f4d5158")


def test_ws_frame_lengths():
    for n, head in ((125, 2), (126, 4), (65535, 4), (65536, 10)):
        frame = ws_frame(2, b"\x00" * n)
        assert len(frame) == head + 4 + n


def test_ws_reader_joins_fragments_split_anywhere():
    stream = (
        server_frame(1, b"1|2|", fin=False)
        + server_frame(9, b"ping!")  # a control frame between fragments
        + server_frame(0, b"3|4", fin=True)
        + server_frame(2, b"\x00" * 70000)
    )
    for step in (1, 7, len(stream)):
        reader = WebSocketReader(1 << 20)
        out = []
        for i in range(0, len(stream), step):
            out.extend(reader.feed(stream[i : i + step]))
        assert out == [("ping", b"ping!"), (False, b"1|2|3|4"), (True, b"\x00" * 70000)]


@pytest.mark.parametrize(
    "frame",
    [
        bytes([0x81, 0x81]) + b"mask" + b"x",  # masked by the server
        bytes([0xC1, 0x01]) + b"x",  # RSV1 without an extension
        server_frame(9, b"x" * 126),  # control frame too long
        server_frame(8, b"", fin=False),  # fragmented control frame
        server_frame(0, b"x"),  # continuation of nothing
        server_frame(1, b"\xff"),  # text that is not UTF-8
        server_frame(2, b"x" * 101),  # over the limit
        server_frame(3, b""),  # unknown opcode
        server_frame(1, b"a", fin=False) + server_frame(1, b"b"),  # new message mid-message
    ],
)
def test_ws_reader_rejects_protocol_errors(frame):
    reader = WebSocketReader(100)
    with pytest.raises(RemoteProtocolError):
        list(reader.feed(frame))
