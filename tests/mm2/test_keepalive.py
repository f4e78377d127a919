"""Micromessage2 has no heartbeat, so the broker finds dead peers with TCP keepalive: the
socket of every Micromessage2 connection, plain or under TLS, gets SO_KEEPALIVE and probe
timings derived from ``keepalive`` (read back with getsockopt on real connections; the
timings themselves: tests/framework/test_tcpkeepalive.py)."""

from __future__ import annotations

import socket
import ssl

import pytest

from msgbroker import BrokerConfig
from msgbroker.tcpkeepalive import tcp_socket
from msgbroker.testing import connect, make_broker
from tests.certs import make_pki
from tests.ssmp.e2e_support import WAIT, parse_address, running_broker

pytestmark = pytest.mark.skipif(
    not all(hasattr(socket, name) for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT")),
    reason="the TCP keepalive timings are Linux socket options",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def running(pki):
    with running_broker(
        ("mm2=tcp:0:interface=127.0.0.1", "mm2=tls:0:interface=127.0.0.1"),
        keepalive=7.5,
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
    ) as broker:
        yield broker


def server_socket_options(running, client_port):
    """SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT of the broker's side of the
    connection from ``client_port``, read in the reactor thread."""
    broker = running.service.broker

    def read():
        for session in broker.sessions:
            # found without the code under test: TCP's handle, or TLS's transport's
            transport = session.link.transport_link.transport
            sock = transport.getHandle()
            if not isinstance(sock, socket.socket):
                sock = transport.transport.getHandle()
            if sock.getpeername()[1] == client_port:
                return (
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                )
        return None

    return running.thread.call(read)


def listener_port(running, index):
    return parse_address(running.service.broker.listening[index][1])[1]


def test_a_plain_tcp_connection_has_keepalive_from_keepalive(running):
    with socket.create_connection(("127.0.0.1", listener_port(running, 0)), timeout=WAIT) as sock:
        # the broker's session exists once it answered something: send a hello, read the reply
        sock.sendall(bytes((1, 1, 0, 1)) + b"a" + b"\x00\x00\x00\x00")
        assert sock.recv(65536)
        options = server_socket_options(running, sock.getsockname()[1])
    assert options == (1, 8, 3, 3)  # 7.5 s rounded up; three probes 3 s apart


def test_under_tls_the_tcp_socket_has_it_too(running, pki):
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    raw = socket.create_connection(("127.0.0.1", listener_port(running, 1)), timeout=WAIT)
    with context.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(bytes((1, 1, 0, 1)) + b"a" + b"\x00\x00\x00\x00")
        assert sock.recv(65536)
        options = server_socket_options(running, sock.getsockname()[1])
    assert options == (1, 8, 3, 3)


def test_an_in_memory_transport_has_no_socket_and_is_left_alone():
    broker = make_broker(BrokerConfig(auth=("open",)))
    conn = connect(broker, "mm2")  # a StringTransport: nothing to set, nothing raised
    assert tcp_socket(conn.transport) is None
    assert not conn.closed
