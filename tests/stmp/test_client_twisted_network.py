"""The Twisted client (``connect()`` and :class:`STMPClientProtocol`) over real sockets:
against the fake server, and in the ``# real broker:`` tests against a real broker too, over
TCP, WebSocket, TLS and wss; timeouts, refused versions, heartbeats and the WebSocket wire
format on a live connection; ``connect()``'s default ports and failures. The protocol's logic
on a Clock is in ``test_client_twisted.py``; the fake and the targets in ``client_support.py``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import defer

from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.client import (
    BlockingSTMPClient,
    Delivery,
    STMPConnectionClosed,
    STMPError,
    client_tls_options,
    connect,
)
from msgbroker.plugins.stmp.codec import Ping, Request, Status, encode_binary
from tests.ssmp.e2e_support import Inbox
from tests.stmp.client_support import (
    DELAY,
    ECHO,
    JSON,
    MSGPACK,
    NOTIFY_BACK,
    RAW,
    FakeSTMPServer,
    Target,
    fake_or_broker,
    twisted_client,
    when_handled,
)


@pytest.fixture(params=["fake-tls", "fake-wss", "broker-tls", "broker-wss"])
def tls_target(request, thread, tls_context) -> Iterator[Target]:
    """The fake server or the real broker, over TLS or WebSocket over TLS (wss)."""
    with fake_or_broker(request, thread, tls=tls_context) as chosen:
        yield chosen


# real broker: login, subscribe, publish and the delivery, over TCP and WebSocket
def test_twisted_publish_reaches_a_subscriber(target):
    inbox = Inbox()
    bob = twisted_client(target, identity="bob", on_delivery=inbox)
    alice = twisted_client(target, identity="alice")
    assert (bob.identity, bob.stmp_version) == ("bob", (0, 1))
    assert target.thread.call(bob.subscribe, "news") is None
    assert target.thread.call(alice.publish, "news", b"hello | world") is None
    assert target.thread.call(inbox.get) == Delivery("alice", "mcast", "news", b"hello | world")
    target.thread.call(alice.close)
    target.thread.call(bob.close)


# real broker: binary data both ways, JSON (data_b64) and msgpack (bytes)
@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_twisted_binary_data_round_trips(target, encoding):
    inbox = Inbox()
    bob = twisted_client(target, identity="bob", on_delivery=inbox, encoding=encoding)
    alice = twisted_client(target, identity="alice", encoding=encoding)
    data = bytes(range(256)) * 4 + b"|\x00|"
    target.thread.call(bob.subscribe, "bin")
    target.thread.call(alice.subscribe, "bin")  # a broadcast reaches peers sharing a topic
    target.thread.call(alice.publish, "bin", data)
    assert target.thread.call(inbox.get).data == data
    target.thread.call(alice.unicast, "bob", b"\xff")
    assert target.thread.call(inbox.get) == Delivery("alice", "ucast", None, b"\xff")
    target.thread.call(alice.broadcast, b"\x00")
    assert target.thread.call(inbox.get) == Delivery("alice", "bcast", None, b"\x00")
    target.thread.call(alice.close)
    target.thread.call(bob.close)


# real broker: unicast to nobody is 0x24
def test_twisted_unicast_to_nobody_fails_with_not_found(target):
    alice = twisted_client(target, identity="alice")
    with pytest.raises(STMPError) as info:
        target.thread.call(alice.unicast, "nobody", b"x")
    assert info.value.status == Status.NOT_FOUND
    target.thread.call(alice.close)


def test_twisted_timeout_and_late_reply_on_a_real_connection(server):
    proto = twisted_client(server, identity="alice", timeout=0.2)
    response = server.thread.call(proto.request, DELAY, {"delay": 0.6})
    assert response.status == Status.REQUEST_TIMEOUT
    when_handled(server.thread, proto, lambda: proto.late_replies == 1)
    assert server.thread.call(proto.request, ECHO, [1]).payload == b"[1]"  # still usable


def test_twisted_version_refused_over_the_network(thread, server):
    server.versions = ((0, 2),)
    with pytest.raises(STMPError) as info:
        twisted_client(server, identity="alice")
    assert info.value.status == Status.VERSION_NOT_SUPPORTED
    assert server.wait(lambda: server.ended(0))
    assert server.requests(payloads.LOGIN) == []  # never got that far


def test_twisted_notify_back_reaches_on_notify(server):
    inbox = Inbox()
    proto = twisted_client(server, identity="alice", on_notify=inbox)
    server.thread.call(proto.call, NOTIFY_BACK, {"n": 1})
    notify = server.thread.call(inbox.get)
    assert notify.action == NOTIFY_BACK and json.loads(notify.payload) == {"n": 1}


def test_twisted_ws_text_wire_format(ws_server):
    proto = twisted_client(ws_server, identity="alice")
    server = ws_server
    assert server.frames[0] == (False, b"1|5|0|0|01")  # version check, hex list inline
    server.thread.call(proto.request, ECHO, "a|b||c")
    assert (False, b'1|2|2|16777217|"a|b||c"') in server.frames  # JSON inline, | kept
    reply = server.thread.call(proto.request, ECHO, b"\x00\xff|", encoding=RAW)
    assert reply.payload == b"\x00\xff|"
    header = b"1|5|3|16777217"  # raw: the two-frame form
    index = server.frames.index((False, header))
    assert server.frames[index + 1] == (True, b"\x00\xff|")


def test_twisted_ws_msgpack_travels_in_two_frames_both_ways(ws_server):
    inbox = Inbox()
    bob = twisted_client(ws_server, identity="bob", encoding=MSGPACK, on_delivery=inbox)
    alice = twisted_client(ws_server, identity="alice", encoding=MSGPACK)
    ws_server.thread.call(bob.subscribe, "t")
    ws_server.thread.call(alice.publish, "t", b"\x00\x01")
    assert ws_server.thread.call(inbox.get) == Delivery("alice", "mcast", "t", b"\x00\x01")
    publish = [f for f in ws_server.frames if f[1].startswith(b"1|3|")]
    assert publish and all(b"|" not in f[1].split(b"|", 4)[-1] for f in publish)


def test_twisted_ws_version_reply_in_two_frames_is_accepted(thread):
    with FakeSTMPServer(thread, ws=True, version_inline=False) as server:
        proto = twisted_client(server, identity="alice")
        assert proto.stmp_version == (0, 1)


def test_twisted_ws_binary_frames(ws_server):
    proto = twisted_client(ws_server, identity="alice", binary_frames=True)
    version_frame = ws_server.frames[0]
    assert version_frame == (True, encode_binary(Request(0, 0, RAW, b"\x01"), with_ps=False))
    assert ws_server.thread.call(proto.request, ECHO, {"k": "|"}).payload == b'{"k":"|"}'


def test_twisted_heartbeat_on_a_real_connection(thread):
    with FakeSTMPServer(thread, ping_every=0.1) as server:
        proto = twisted_client(server, identity="alice", heartbeat=0.1)
        server.wait(lambda: len(server.logged(Ping)) >= 2)  # the client pings
        # ... and hears the server's
        when_handled(server.thread, proto, lambda: proto.pings_received >= 2)


def test_twisted_gives_up_on_a_silent_server(thread):
    with FakeSTMPServer(thread) as server:
        proto = twisted_client(server, identity="alice", heartbeat=0.1)
        reason = thread.call(proto.when_closed)
        assert "nothing from the server" in str(reason)


# real broker: tls and wss listeners
def test_twisted_over_tls(pki, tls_target):
    thread, port, ws = tls_target.thread, tls_target.port, tls_target.ws
    tls = client_tls_options("127.0.0.1", ca=str(pki.ca.cert_path))

    def connect_as(identity: str, **options: Any) -> Any:
        return thread.call(
            lambda: connect(
                thread.reactor, "127.0.0.1", port, ws=ws, tls=tls, identity=identity, **options
            )
        )

    inbox = Inbox()
    bob = connect_as("bob", on_delivery=inbox)
    alice = connect_as("alice")
    thread.call(bob.subscribe, "secure")
    thread.call(alice.publish, "secure", b"over tls")
    assert thread.call(inbox.get) == Delivery("alice", "mcast", "secure", b"over tls")
    if isinstance(tls_target, FakeSTMPServer):  # the echo action is the fake's
        assert thread.call(alice.request, ECHO, "over tls").payload == b'"over tls"'
    thread.call(alice.close)
    thread.call(bob.close)


# -- connect() helpers ---------------------------------------------------------------------------


def test_connect_defaults_to_4445_and_4446_for_websocket(thread, monkeypatch):
    from msgbroker.clientkit import protocol as client_module  # where connect's endpoint is made

    seen = []

    class Endpoint:
        def __init__(self, reactor, host, port, timeout):
            seen.append((host, port))

        def connect(self, factory):
            return defer.fail(ConnectionRefusedError())

    monkeypatch.setattr(client_module, "HostnameEndpoint", Endpoint)
    for ws in (False, True):
        with pytest.raises(ConnectionRefusedError):
            thread.call(connect, thread.reactor, "127.0.0.1", ws=ws)
    assert seen == [("127.0.0.1", 4445), ("127.0.0.1", 4446)]

    def create_connection(address, timeout):
        seen.append(address)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", create_connection)
    for ws in (False, True):
        with pytest.raises(ConnectionRefusedError):
            BlockingSTMPClient("127.0.0.1", ws=ws)
    assert seen[2:] == [("127.0.0.1", 4445), ("127.0.0.1", 4446)]


def test_twisted_ws_handshake_failure_fails_the_connect(tcp_server):
    # a TCP STMP server does not speak HTTP: it sees garbage and drops us
    thread = tcp_server.thread
    with pytest.raises(STMPConnectionClosed):
        thread.call(lambda: connect(thread.reactor, "127.0.0.1", tcp_server.port, ws=True))


def test_twisted_connection_dropped_before_the_version_reply(thread, tcp_server):
    tcp_server.behaviour[0] = lambda server, conn, request: conn.drop()
    with pytest.raises(STMPConnectionClosed):
        twisted_client(tcp_server, identity="alice")
