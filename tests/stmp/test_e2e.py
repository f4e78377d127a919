"""STMP over real sockets: TCP and WebSocket listeners, TLS on both (wss included) with
certificate login, garbage closing only its connection, and a slow STMP consumer."""

from __future__ import annotations

import socket
import ssl

import pytest

from msgbroker.plugins.stmp.client import BlockingSTMPClient, STMPError
from msgbroker.plugins.stmp.codec import Status
from tests.certs import make_pki
from tests.ssmp.e2e_support import parse_address, running_broker
from tests.stmp.raw_support import ended, flood_past_a_stalled_reader, request

LISTENERS = (
    "stmp=tcp:0:interface=127.0.0.1",
    "stmp-ws=tcp:0:interface=127.0.0.1",
    "stmp=tls:0:interface=127.0.0.1",
    "stmp-ws=tls:0:interface=127.0.0.1",
)


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
        max_backlog=64 * 1024,
    ) as running:
        yield running


def port(broker, index):
    return parse_address(broker.service.broker.listening[index][1])[1]


def tls_context(pki, client=None):
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


@pytest.mark.parametrize(("index", "ws"), [(0, False), (1, True)], ids=["tcp", "ws"])
def test_plain_transports_publish_and_deliver(broker, index, ws):
    with (
        BlockingSTMPClient("127.0.0.1", port(broker, index), f"reader-{index}", ws=ws) as reader,
        BlockingSTMPClient("127.0.0.1", port(broker, 0), f"writer-{index}") as writer,
    ):
        reader.subscribe(f"e2e-{index}")
        writer.publish(f"e2e-{index}", b"a|b\x00\xff")
        delivery = reader.next_delivery(10)
    assert (delivery.sender, delivery.kind, delivery.topic, delivery.data) == (
        f"writer-{index}",
        "mcast",
        f"e2e-{index}",
        b"a|b\x00\xff",
    )


@pytest.mark.parametrize(("index", "ws"), [(2, False), (3, True)], ids=["tls", "wss"])
def test_certificate_login_over_tls_and_wss(broker, pki, index, ws):
    alice = pki.client("alice", filename=f"alice-stmp-{index}")
    with BlockingSTMPClient(
        "127.0.0.1",
        port(broker, index),
        "alice/stmp",
        "cert",
        ws=ws,
        ssl_context=tls_context(pki, alice),
        server_hostname="localhost",
    ) as client:
        client.subscribe("secure")
        assert client.identity == "alice/stmp"
    with pytest.raises(STMPError) as refused:
        BlockingSTMPClient(
            "127.0.0.1",
            port(broker, index),
            "mallory",
            "cert",
            ws=ws,
            ssl_context=tls_context(pki, alice),
            server_hostname="localhost",
        )
    assert refused.value.status == Status.UNAUTHORIZED
    assert refused.value.payload == {"schemes": ["open", "cert"]}


def test_cert_login_without_tls_is_refused(broker):
    with pytest.raises(STMPError) as refused:
        BlockingSTMPClient("127.0.0.1", port(broker, 0), "alice", "cert")
    assert refused.value.status == Status.UNAUTHORIZED


def test_websocket_garbage_closes_only_that_connection(broker):
    with BlockingSTMPClient("127.0.0.1", port(broker, 1), "bystander", ws=True) as bystander:
        raw = socket.create_connection(("127.0.0.1", port(broker, 1)), timeout=10)
        raw.sendall(
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        response = b""
        while b"\r\n\r\n" not in response:
            response += raw.recv(4096)
        assert response.startswith(b"HTTP/1.1 101")
        mask = b"\x01\x02\x03\x04"
        garbage = b"9|9|9"
        raw.sendall(
            bytes((0x81, 0x80 | len(garbage)))
            + mask
            + bytes(b ^ mask[i % 4] for i, b in enumerate(garbage))
        )
        close = b""
        while len(close) < 2 or len(close) < 2 + (close[1] & 0x7F):
            close += raw.recv(4096)
        assert close[0] == 0x88  # the server's close frame: 1002, protocol error
        assert close[2:4] == (1002).to_bytes(2, "big")
        raw.sendall(b"\x88\x82" + mask + bytes(b ^ mask[i] for i, b in enumerate(close[2:4])))
        assert ended(raw)  # then it closes the TCP connection
        raw.close()
        bystander.subscribe("still-here")


def test_tcp_garbage_closes_only_that_connection(broker):
    with BlockingSTMPClient("127.0.0.1", port(broker, 0), "bystander-tcp") as bystander:
        raw = socket.create_connection(("127.0.0.1", port(broker, 0)), timeout=10)
        raw.sendall(b"\x47garbage")
        assert raw.recv(100) == b""
        raw.close()
        bystander.subscribe("still-here-too")


def test_slow_stmp_consumer_is_disconnected_and_others_keep_receiving(broker):
    payload, count = b"y" * 4000, 2000  # ~8 MB: beyond the kernel's buffers and the budget
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", port(broker, 0)))
    stalled.settimeout(30)
    stalled.sendall(
        request(1, "0.0.1.1", {"id": "stmp-stalled", "scheme": "open"})
        + request(2, "0.0.1.2", {"topic": "flood"})
    )
    received = flood_past_a_stalled_reader(port(broker, 0), "flood", count, payload)
    assert len(received) == count and set(received) == {payload}
    # the stalled consumer was cut off: its socket ends once what was sent is read
    assert ended(stalled)
    stalled.close()
