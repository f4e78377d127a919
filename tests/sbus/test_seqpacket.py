"""The seqpacket transport (plugins/sbus/seqpacket.py) on real sockets: addresses, binding,
credentials, reading in slices, writing through the outbox, and closing."""

from __future__ import annotations

import os
import socket
import stat

import pytest
from twisted.internet.task import Clock

from msgbroker.plugins.sbus import seqpacket
from msgbroker.plugins.sbus.seqpacket import (
    SeqpacketAddress,
    SeqpacketConnection,
    bind,
    parse_address,
    parse_endpoint,
    peer_credentials,
)


class Recorder:
    """A protocol that records packets and the end."""

    def __init__(self) -> None:
        self.packets: list[bytes] = []
        self.lost: list[object] = []
        self.transport: object = None

    def makeConnection(self, transport: object) -> None:
        self.transport = transport

    def packetReceived(self, data: bytes) -> None:
        self.packets.append(data)

    def connectionLost(self, reason: object) -> None:
        self.lost.append(reason)


class FakeReactor(Clock):
    """A Clock that also takes readers and writers (what a FileDescriptor registers)."""

    def __init__(self) -> None:
        super().__init__()
        self.readers: set[object] = set()
        self.writers: set[object] = set()

    def addReader(self, r: object) -> None:
        self.readers.add(r)

    def removeReader(self, r: object) -> None:
        self.readers.discard(r)

    def addWriter(self, w: object) -> None:
        self.writers.add(w)

    def removeWriter(self, w: object) -> None:
        self.writers.discard(w)


@pytest.fixture
def pair():
    server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.setblocking(False)
    reactor = FakeReactor()
    protocol = Recorder()
    connection = SeqpacketConnection(server, protocol, reactor, max_packet=100)
    protocol.makeConnection(connection)
    connection.startReading()
    yield connection, protocol, client, reactor
    client.close()
    server.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/run/bus", SeqpacketAddress(path="/run/bus")),
        ("relative/bus", SeqpacketAddress(path="relative/bus")),
        ("/dev/fd/3", SeqpacketAddress(fd=3)),
        # the reference's form: the hex of the whole sun_path, padded with NULs
        ("/dev/unix/abstract/006275730a", SeqpacketAddress(abstract=b"bus\n".ljust(107, b"\0"))),
        ("/dev/unix/abstract/2f746d702f78", SeqpacketAddress(path="/tmp/x")),
        ("@name", SeqpacketAddress(abstract=b"name")),
    ],
)
def test_addresses_as_sbusd_takes_them(text, expected):
    assert parse_address(text) == expected


def test_a_random_abstract_address_is_new_each_time_and_printable():
    one, two = parse_address("/dev/unix/abstract"), parse_address("/dev/unix/abstract")
    assert one.abstract and two.abstract and one != two and len(one.abstract) == 107
    assert str(one) == "/dev/unix/abstract/00" + one.abstract.hex()
    assert parse_address(str(one)) == one


@pytest.mark.parametrize(
    "text",
    [
        "",
        "/dev/fd/x",
        "/dev/unix/abstract/zz",
        "/dev/unix/abstract/",
        "/dev/unix/abstract/" + "00" * 109,
    ],
)
def test_bad_addresses_are_value_errors(text):
    with pytest.raises(ValueError):
        parse_address(text)


def test_endpoint_strings_carry_mode_and_maximum_packet():
    endpoint = parse_endpoint(None, "unix:/tmp/x/bus:mode=0770:max-packet=4096")
    assert endpoint.address == SeqpacketAddress(path="/tmp/x/bus")
    assert (endpoint.mode, endpoint.max_packet) == (0o770, 4096)
    assert parse_endpoint(None, "unix:address=/tmp/b").address == SeqpacketAddress(path="/tmp/b")
    assert parse_endpoint(None, "/tmp/c").mode == 0o700
    with pytest.raises(ValueError):
        parse_endpoint(None, "unix:/tmp/d:max-packet=0")


def test_bind_sets_the_mode_before_anyone_can_connect(tmp_path):
    path = str(tmp_path / "bus")
    sock = bind(SeqpacketAddress(path=path), mode=0o750)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o750
        assert sock.type == socket.SOCK_SEQPACKET
    finally:
        sock.close()


def test_bind_replaces_a_live_socket_only_when_asked(tmp_path):
    path = str(tmp_path / "bus")
    first = bind(SeqpacketAddress(path=path))
    try:
        second = bind(SeqpacketAddress(path=path), replace=True)
        second.close()
    finally:
        first.close()


def test_an_abstract_address_binds_without_a_file():
    address = parse_address("/dev/unix/abstract")
    sock = bind(address)
    try:
        client = seqpacket.connect(address, timeout=5)
        client.close()
    finally:
        sock.close()


def test_an_inherited_socket_is_used_as_it_is(tmp_path):
    path = str(tmp_path / "bus")
    original = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    original.bind(path)
    try:
        sock = bind(SeqpacketAddress(fd=original.fileno()))
        try:
            client = seqpacket.connect(path, timeout=5)
            client.close()
        finally:
            sock.close()
        stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with pytest.raises(OSError):
                bind(SeqpacketAddress(fd=stream.fileno()))
        finally:
            stream.close()
    finally:
        original.close()


def test_peer_credentials_are_the_connecting_process():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        assert peer_credentials(a) == seqpacket.Credentials(os.getpid(), os.getuid(), os.getgid())
    finally:
        a.close()
        b.close()


def test_reading_takes_one_slice_per_event_then_the_rest(pair):
    connection, protocol, client, _ = pair
    count = seqpacket.PACKETS_PER_EVENT + 10
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    for i in range(count):
        client.send(b"%d" % i)
    assert connection.doRead() is None
    assert len(protocol.packets) == seqpacket.PACKETS_PER_EVENT
    assert connection.doRead() is None
    assert protocol.packets == [b"%d" % i for i in range(count)]


def test_a_packet_over_the_maximum_arrives_one_byte_longer_than_it(pair):
    connection, protocol, client, _ = pair
    client.send(b"x" * 500)
    connection.doRead()
    assert protocol.packets == [b"x" * 101]


def test_packets_sent_before_the_end_are_read_before_it(pair):
    connection, protocol, client, _ = pair
    client.send(b"one")
    client.send(b"two")
    client.close()
    assert connection.doRead() is seqpacket.main.CONNECTION_DONE
    assert protocol.packets == [b"one", b"two"]


def test_pausing_stops_reading_in_the_middle_and_resuming_reads_on(pair):
    connection, protocol, client, reactor = pair
    for i in range(5):
        client.send(b"%d" % i)
    protocol.packetReceived = lambda data: (  # type: ignore[method-assign]
        protocol.packets.append(data),
        data == b"1" and connection.pauseProducing(),
    )
    connection.doRead()
    assert protocol.packets == [b"0", b"1"] and connection not in reactor.readers
    connection.resumeProducing()
    assert connection in reactor.readers
    reactor.advance(0)  # what waited is read without waiting for the next poll
    assert protocol.packets == [b"0", b"1", b"2", b"3", b"4"]


def test_writes_that_do_not_fit_wait_for_writability_and_then_go(pair):
    connection, _, client, reactor = pair
    connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sent = 0
    while not connection.outbox.backlog:
        connection.write(b"%06d" % sent)
        sent += 1
    assert connection in reactor.writers
    got = []
    while connection.outbox.backlog:
        client.setblocking(False)
        try:
            while True:
                got.append(client.recv(100))
        except BlockingIOError:
            pass
        connection.doWrite()
    assert connection not in reactor.writers
    got += [client.recv(100) for _ in range(sent - len(got))]
    assert got == [b"%06d" % i for i in range(sent)]


def test_lose_connection_sends_what_waits_first(pair):
    connection, protocol, client, reactor = pair
    connection.write(b"last words")
    connection.loseConnection()
    reactor.advance(0)
    assert protocol.lost and client.recv(100) == b"last words"
    assert client.recv(100) == b""


def test_abort_drops_what_waits(pair):
    connection, protocol, client, reactor = pair
    connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    while not connection.outbox.backlog:
        connection.write(b"x" * 50)
    connection.abortConnection()
    reactor.advance(0)
    assert protocol.lost and connection.outbox.backlog == 0
