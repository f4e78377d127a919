"""Micromessage2 over real sockets, with clients made of raw frames (the codec only): plain
TCP, TLS with certificate login, SSMP interop, and garbage that closes only its own
connection."""

from __future__ import annotations

import socket
import ssl

import pytest

from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import ErrorFrame, Handshake, MessageFrame, Subscribe
from tests.certs import make_pki
from tests.ssmp.e2e_support import parse_address, running_broker

LISTENERS = (
    "mm2=tcp:0:interface=127.0.0.1",
    "mm2=tls:0:interface=127.0.0.1",
    "ssmp=tcp:0:interface=127.0.0.1",
)
WAIT = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(pki):
    with running_broker(
        LISTENERS,
        auth=("open", "cert"),
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_ca=str(pki.ca.cert_path),
    ) as running:
        yield running


def port(broker, index):
    return parse_address(broker.service.broker.listening[index][1])[1]


class RawClient:
    """A Micromessage2 client of a few lines over the codec: handshake, frames in and out."""

    def __init__(self, port, identity, optional=("pubsub",), context=None):
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.seq = 0
        hello = Handshake(identity, (), codec.parse_extension_list(";".join(optional)))
        sock.sendall(codec.encode_handshake(hello))
        decoder = codec.HandshakeDecoder()
        self.reply = None
        while self.reply is None:
            self.reply = decoder.feed(self._recv())
        self.frames = codec.FrameDecoder()
        self.frames.receive_data(decoder.trailing_data)
        sock.sendall(codec.encode_handshake(hello))  # step 3: the same lists

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the broker")
        return data

    def send(self, *frames):
        self.sock.sendall(b"".join(codec.encode_frame(f) for f in frames))

    def subscribe(self, destination):
        self.send(codec.encode_pubsub(Subscribe(destination)))

    def publish(self, destination, payload):
        self.seq = codec.next_seq(self.seq)
        self.send(MessageFrame(self.seq, destination, payload))

    def next_frame(self):
        while True:
            frame = self.frames.next_event()
            if frame is not None:
                return frame
            self.frames.receive_data(self._recv())

    def sync(self, identity):
        """Every frame before a message this client unicasts to itself (so what was sent
        before it has been handled)."""
        marker = b"sync-%d" % id(self)
        self.publish("@" + identity, marker)
        before = []
        while (frame := self.next_frame()) != MessageFrame(frame.seq, "@" + identity, marker):
            before.append(frame)
        return before

    def close(self):
        self.sock.close()


def tls_context(pki, client):
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


def test_plain_tcp_subscriber_gets_what_ssmp_publishes(broker):
    sub = RawClient(port(broker, 0), "mm2-sub")
    sub.subscribe("news")
    sub.sync("mm2-sub")
    ssmp = socket.create_connection(("127.0.0.1", port(broker, 2)), timeout=WAIT)
    ssmp.sendall(b"LOGIN ssmp-pub open x\nMCAST news hello\n")
    assert sub.next_frame() == MessageFrame(2, "news", b"hello")  # 1 was the sync marker
    ssmp.close()
    sub.close()


def test_certificate_login_over_tls(broker, pki):
    alice = pki.client("alice", filename="alice-mm2")
    client = RawClient(port(broker, 1), "alice/mm2", context=tls_context(pki, alice))
    assert client.sync("alice/mm2") == []  # logged in: its unicast to itself came back
    client.close()
    refused = RawClient(port(broker, 1), "mallory", context=tls_context(pki, alice))
    assert refused.next_frame() == ErrorFrame("login refused")
    with pytest.raises(ConnectionError):
        refused.next_frame()
    refused.close()


def test_garbage_closes_only_that_connection(broker):
    bystander = RawClient(port(broker, 0), "bystander")
    bystander.subscribe("still-here")
    raw = RawClient(port(broker, 0), "garbage")
    raw.sock.sendall(b"\xe0\x00\x01garbage")
    assert isinstance(raw.next_frame(), ErrorFrame)
    with pytest.raises(ConnectionError):
        raw.next_frame()
    raw.close()
    assert bystander.sync("bystander") == []
    bystander.close()


def test_a_handshake_of_another_major_version_gets_an_error_frame_and_close(broker):
    raw = socket.create_connection(("127.0.0.1", port(broker, 0)), timeout=WAIT)
    raw.sendall(codec.encode_handshake(Handshake("future", major=2)))
    received = b""
    while chunk := raw.recv(65536):
        received += chunk
    (error,) = codec.FrameDecoder().feed(received)  # then the broker closed
    assert isinstance(error, ErrorFrame)
    raw.close()
