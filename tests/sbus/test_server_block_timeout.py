"""One sbus client that asks for ``blocking/soft/block`` on every topic and never reads
cannot freeze the bus (docs/sbus.md: one slow client never blocks the bus or any other
client): through a real broker and real sockets, its publishers are paused for at most
``--block-timeout``, then it is cut (``--slow-consumer disconnect``) or discarded for
(``drop``), and the publishers finish their burst."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Callable

import pytest

from tests.certs import make_pki
from tests.sbus.server_support import Bus, RawClient, running_bus
from tests.ssmp.e2e_support import WAIT, running_broker

PAYLOAD = b"p" * 1000
COUNT = 2000  # ~2 MB: far past what the kernel queues for a client that does not read


def blocker(bus: Bus) -> RawClient:
    """The attacker: every topic, block, a tiny receive buffer, and it never reads."""
    client = bus.client(rcvbuf=4096)
    client.send(b"CMSG blocking/soft/block")
    client.send(b"SUB ")
    client.sync()
    return client


def ssmp_publisher(bus: Bus, key: bytes) -> Callable[[], None]:
    sock, reader = bus.ssmp("pub-" + key.decode())

    def burst() -> None:
        sock.sendall(b"".join(b"MCAST %s %06d%s\n" % (key, i, PAYLOAD) for i in range(COUNT)))
        for _ in range(COUNT):
            assert reader.readline() == b"200\n"

    return burst


def sbus_publisher(bus: Bus, key: bytes) -> Callable[[], None]:
    client = bus.client()

    def burst() -> None:
        for i in range(COUNT):
            client.send(b"MSG %s\0%06d%s" % (key, i, PAYLOAD))
        client.sync()  # everything it sent has been routed

    return burst


def finishes(burst: Callable[[], None]) -> threading.Thread:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            burst()
        except BaseException as e:  # reported by the test, not lost in the thread
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.failures = failures  # type: ignore[attr-defined]
    thread.start()
    return thread


def numbers_of(packets: list[bytes]) -> list[int]:
    return [int(p[p.index(b"\0") + 1 :][:6]) for p in packets]


@pytest.mark.parametrize("make_publisher", [ssmp_publisher, sbus_publisher])
def test_a_blocker_is_cut_after_the_timeout_and_the_publisher_and_readers_go_on(
    make_publisher,
):
    with running_bus(block_timeout=0.2) as bus:
        slow = blocker(bus)
        healthy = bus.client()  # soft/queue: never pauses anyone
        healthy.send(b"SUB bt1")
        healthy.sync()
        publish = finishes(make_publisher(bus, b"bt1"))
        for i in range(COUNT):
            healthy.expect(b"MSG bt1\0%06d%s" % (i, PAYLOAD))
        publish.join(WAIT)
        assert not publish.is_alive() and publish.failures == []  # type: ignore[attr-defined]
        assert slow.closed_by_server()  # what it had queued, then the end (not a timeout)
        assert healthy.sync() == []


def test_with_slow_consumer_drop_the_blocker_stays_and_loses_only_its_own_messages():
    with running_bus(block_timeout=0.2, slow_consumer="drop") as bus:
        slow = blocker(bus)
        healthy = bus.client()
        healthy.send(b"SUB bt2")
        healthy.sync()
        publish = finishes(ssmp_publisher(bus, b"bt2"))
        for i in range(COUNT):
            healthy.expect(b"MSG bt2\0%06d%s" % (i, PAYLOAD))
        publish.join(WAIT)
        assert not publish.is_alive() and publish.failures == []  # type: ignore[attr-defined]
        # still connected: it gets what was kept for it, in order, the discarded missing
        got = numbers_of(slow.sync())
        assert got == sorted(got) and got[0] == 0 and len(got) < COUNT
        slow.send(b"MSG bt2\0after")
        # its own copy first: once it has that, the broker has routed the message (to
        # every recipient at once), whichever connection the broker reads first next
        assert slow.sync() == [b"MSG bt2\0after"]
        assert healthy.sync() == [b"MSG bt2\0after"]


def test_a_tls_publisher_is_paused_under_its_tls_layer_and_resumed_after_the_timeout(tmp_path):
    # the throttle pauses the TCP transport under TLS (Twisted's TLS transport hands
    # pauseProducing to it); were the publisher never paused, no block deadline would
    # start and the blocker would never be cut (its bound is 16 MiB, the burst 2 MB)
    pki = make_pki(tmp_path)
    path = os.path.join(tmp_path, "bus")
    with running_broker(
        ("ssmp=tls:0:interface=127.0.0.1", f"sbus=unix:{path}"),
        auth=("open",),
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        block_timeout=0.2,
    ) as broker:
        bus = Bus(broker, path)
        try:
            slow = blocker(bus)
            healthy = bus.client()
            healthy.send(b"SUB bt3")
            healthy.sync()
            context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
            raw = socket.create_connection((broker.host, broker.port), timeout=WAIT)
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                reader = tls.makefile("rb")
                tls.sendall(b"LOGIN tls-pub open\n")
                assert reader.readline() == b"200\n"

                def burst() -> None:
                    lines = (b"MCAST bt3 %06d%s\n" % (i, PAYLOAD) for i in range(COUNT))
                    tls.sendall(b"".join(lines))

                publish = finishes(burst)
                for i in range(COUNT):
                    healthy.expect(b"MSG bt3\0%06d%s" % (i, PAYLOAD))
                publish.join(WAIT)
                assert not publish.is_alive() and publish.failures == []  # type: ignore[attr-defined]
                for _ in range(COUNT):
                    assert reader.readline() == b"200\n"
            assert slow.closed_by_server()
        finally:
            for client in bus.clients:
                client.close()
