"""SIGTERM drains: a real ``twistd msgbroker`` stops accepting, lets each connection flush
what the broker holds for it (here a backlog of megabytes), closes it, and cuts the ones
still stuck after ``--shutdown-grace``."""

from __future__ import annotations

import signal
import socket

import pytest

from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.sbus.client_session import SbusConnectionClosed
from tests.abuse.harness import (
    WAIT,
    BrokerProcess,
    read_exactly,
    ssmp_connect,
    wait_until,
)

MESSAGES = 8000
PAYLOAD = b"x" * 1000  # 8 MB in all: far more than the socket buffers of a small reader


@pytest.fixture
def broker_process():
    started = []

    def start(*options):
        broker = BrokerProcess(*options)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        if broker.alive():
            broker.stop()


def small_reader(address, identity, topic):
    """An SSMP subscriber whose receive buffer is small, so that what it does not read
    stays in the broker."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT)
    sock.connect(address)
    sock.sendall(b"LOGIN %s open\nSUBSCRIBE %s\n" % (identity, topic))
    assert read_exactly(sock, 8) == b"200\n200\n"
    return sock


def publish(address, topic, count):
    publisher = ssmp_connect(address, b"pub")
    line = b"MCAST %s %s\n" % (topic, PAYLOAD)
    for _ in range(count // 100):
        publisher.sendall(line * 100)
        assert read_exactly(publisher, 400) == b"200\n" * 100
    return publisher


def read_to_the_end(sock):
    """Everything until the broker closes; whether it ended with a reset (an abort)."""
    data = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        return bytes(data), True
    return bytes(data), False


def test_sigterm_flushes_a_backlog_and_cuts_a_stuck_reader_after_the_grace(broker_process):
    broker = broker_process("--shutdown-grace", "3", "--max-backlog", "64M")
    address = broker.tcp("ssmp")
    healthy = small_reader(address, b"healthy", b"t")
    stuck = small_reader(address, b"stuck", b"t")
    publisher = publish(address, b"t", MESSAGES)
    # both readers' backlogs are held by the broker, beyond their sockets
    assert wait_until(lambda: broker.status()["bytes_queued"] > 1 << 20)

    broker.process.send_signal(signal.SIGTERM)
    broker.log.wait_for(r"ssmp stopped listening on")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=WAIT)  # no longer accepting
    data, reset = read_to_the_end(healthy)
    assert not reset
    assert data == b"000 pub MCAST t %s\n" % PAYLOAD * MESSAGES  # all of it, then the close
    assert read_to_the_end(publisher) == (b"", False)  # it held nothing: closed at once
    broker.log.wait_for(r"stopping: 3 connections get 3 s to flush what they hold")
    broker.log.wait_for(r"1 connections still open after 3 s: cut")
    data, reset = read_to_the_end(stuck)
    assert reset and len(data) < MESSAGES * len(PAYLOAD)
    assert broker.process.wait(timeout=WAIT) in (0, -signal.SIGTERM)
    broker.assert_no_traceback()


def test_sbus_clients_get_what_their_outbox_holds_before_the_close(broker_process):
    broker = broker_process("--shutdown-grace", "20", "--max-backlog", "64M")
    bus = broker.addresses["sbus"].removeprefix("unix:")
    subscriber = BlockingSbusClient(bus, timeout=WAIT)
    subscriber.subscribe(b"k")
    subscriber.sync()  # the subscription is in place
    count = 2000
    with BlockingSbusClient(bus, timeout=WAIT) as publisher:
        for n in range(count):
            publisher.publish(b"k", b"%d:" % n + PAYLOAD)
        publisher.sync()
    assert wait_until(lambda: broker.status()["bytes_queued"] > 1 << 20)
    broker.process.send_signal(signal.SIGTERM)
    broker.log.wait_for(r"stopping: ")
    received = []

    def read_until_closed():
        for packet in subscriber.messages():
            received.append(packet.payload.split(b":", 1)[0])

    with pytest.raises(SbusConnectionClosed):
        read_until_closed()
    assert received == [b"%d" % n for n in range(count)]
    assert broker.process.wait(timeout=WAIT) in (0, -signal.SIGTERM)
    assert not [line for line in broker.log.lines if "still open after" in line]
