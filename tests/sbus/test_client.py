"""The Twisted sbus client against a real broker (in the shared reactor thread) over real
unix seqpacket sockets: subscriptions and patterns, whoami, echo, flood control, SSMP
both ways, closing, and what it does with a broker that breaks the protocol."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest
from twisted.internet import defer

from msgbroker.clientkit.testing import FakeServer
from msgbroker.plugins.sbus.client import (
    ControlMessage,
    Publish,
    SbusClient,
    SbusConnectionClosed,
    connect,
)
from tests.sbus.server_support import Bus, running_bus
from tests.ssmp.e2e_support import Inbox


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with running_bus() as bus:
        yield bus


def run(bus: Bus, scenario, *args):
    """Run the inlineCallbacks ``scenario(*args)`` in the broker's reactor thread."""
    return bus.broker.call(defer.inlineCallbacks(scenario), *args)


def open_client(bus: Bus, **options) -> tuple[SbusClient, Inbox]:
    inbox = Inbox()
    client = bus.broker.call(connect, bus.broker.reactor, bus.path, on_message=inbox, **options)
    return client, inbox


@pytest.fixture
def clients(bus):
    """``clients(n)``: n connected clients and their inboxes; all closed after the test."""
    made: list[SbusClient] = []

    def make(n: int = 1, **options) -> list[tuple[SbusClient, Inbox]]:
        pairs = [open_client(bus, **options) for _ in range(n)]
        made.extend(client for client, _ in pairs)
        return pairs

    yield make
    for client in made:
        bus.broker.call(client.close)


def test_subscriber_receives_a_published_message(bus, clients):
    (sub, inbox), (pub, _) = clients(2)

    def scenario():
        sub.subscribe(b"c1/news")
        yield sub.sync()
        pub.publish(b"c1/news", b"hello \x00 world")
        message = yield inbox.get()
        return message

    assert run(bus, scenario) == Publish(b"c1/news", b"hello \x00 world")


def test_patterns_choose_what_each_subscriber_receives(bus, clients):
    (star, star_in), (below, below_in), (every, every_in), (pub, _) = clients(4)

    def scenario():
        star.subscribe(b"c2/*/c")
        below.subscribe(b"c2/b/")
        every.subscribe(b"")
        for c in (star, below, every):
            yield c.sync()
        for key in (b"c2/b/c/d", b"c2/x", b"c2/bb/c/", b"c2/b/c"):
            pub.publish(key, b"m")
        seen = []
        for inbox in (star_in, below_in, every_in):
            keys = []
            # c2/b/c, sent last, matches every pattern: what came before it is all there is
            while not keys or keys[-1] != b"c2/b/c":
                message = yield inbox.get()
                if message.key.startswith(b"c2/"):  # '' also sees other tests' keys
                    keys.append(message.key)
            seen.append(keys)
        return seen

    assert run(bus, scenario) == [
        [b"c2/b/c"],
        [b"c2/b/c/d", b"c2/b/c"],
        [b"c2/b/c/d", b"c2/x", b"c2/bb/c/", b"c2/b/c"],
    ]


def test_unsubscribe_stops_delivery(bus, clients):
    (sub, inbox), (pub, _) = clients(2)

    def scenario():
        sub.subscribe(b"c3/a")
        sub.subscribe(b"c3/marker")
        yield sub.sync()
        pub.publish(b"c3/a", b"before")
        yield inbox.get()
        sub.unsubscribe(b"c3/a")
        yield sub.sync()
        pub.publish(b"c3/a", b"after")
        pub.publish(b"c3/marker", b"sync")  # routed after "after": its absence is proven
        marker = yield inbox.get()
        return marker, inbox.items

    marker, items = run(bus, scenario)
    assert marker == Publish(b"c3/marker", b"sync")
    assert items == [Publish(b"c3/a", b"before"), marker]


def test_whoami_is_this_process_credentials(bus, clients):
    ((client, _),) = clients(1)
    credentials = bus.broker.call(client.whoami)
    assert credentials == b"!/cred/%d/%d/%d" % (os.getgid(), os.getuid(), os.getpid())


def test_secret_key_with_own_credentials_is_delivered(bus, clients):
    ((client, inbox),) = clients(1)

    def scenario():
        me = yield client.whoami()
        client.subscribe(b"!/cred///" + b"/secret/")  # empty fields: filled in by the broker
        yield client.sync()
        client.publish(me + b"/secret/x", b"for me")
        message = yield inbox.get()
        return me, message

    me, message = run(bus, scenario)
    assert message == Publish(me + b"/secret/x", b"for me")


def test_echo_off_stops_own_messages_and_echo_on_restores_them(bus, clients):
    ((client, inbox),) = clients(1)

    def scenario():
        client.subscribe(b"c4/self")
        client.echo(False)
        client.publish(b"c4/self", b"unheard")
        yield client.sync()  # the broker routed it before answering: it would be here
        unheard = list(inbox.items)
        client.echo(True)
        client.publish(b"c4/self", b"heard")
        message = yield inbox.get()
        return unheard, message

    unheard, message = run(bus, scenario)
    assert unheard == []
    assert message == Publish(b"c4/self", b"heard")


def test_flood_control_choices_are_accepted_and_bad_ones_refused(bus, clients):
    ((client, inbox),) = clients(1)

    def scenario():
        client.flood(soft="discard", hard="block", order="stack")
        client.subscribe(b"c5/x")
        client.publish(b"c5/x", b"still connected")
        message = yield inbox.get()
        return message

    assert run(bus, scenario) == Publish(b"c5/x", b"still connected")
    with pytest.raises(ValueError, match="blocking/soft/later"):
        bus.broker.call(client.flood, soft="later")


def test_ssmp_mcast_reaches_an_sbus_subscriber(bus, clients):
    ((sub, inbox),) = clients(1)
    bus.broker.call(sub.subscribe, b"c6/topic")
    bus.broker.call(sub.sync)
    sock, reader = bus.ssmp("c6-publisher")
    with sock, reader:
        sock.sendall(b"MCAST c6/topic hello from ssmp\n")
        assert reader.readline() == b"200\n"
    assert bus.broker.call(inbox.get) == Publish(b"c6/topic", b"hello from ssmp")


def test_sbus_publish_reaches_an_ssmp_subscriber(bus, clients):
    ((pub, _),) = clients(1)
    sock, reader = bus.ssmp("c7-subscriber")
    with sock, reader:
        sock.sendall(b"SUBSCRIBE c7/topic\n")
        assert reader.readline() == b"200\n"
        bus.broker.call(pub.publish, b"c7/topic", b"hello from sbus")
        line = reader.readline()
    assert line == b"000 sbus:%d:%d MCAST c7/topic hello from sbus\n" % (
        os.getuid(),
        os.getpid(),
    )


def test_close_fires_and_later_sends_raise(bus, clients):
    client, _ = open_client(bus)

    def scenario():
        yield client.close()
        reason = yield client.when_closed()
        return reason

    reason = run(bus, scenario)
    assert client.closed
    assert isinstance(reason, Exception)
    with pytest.raises(SbusConnectionClosed):
        bus.broker.call(client.publish, b"c8/x", b"late")
    with pytest.raises(SbusConnectionClosed):
        bus.broker.call(client.whoami)


def test_packets_written_before_close_are_delivered(bus, clients):
    ((sub, inbox),) = clients(1)
    bus.broker.call(sub.subscribe, b"c9/last")
    bus.broker.call(sub.sync)
    pub, _ = open_client(bus)

    def scenario():
        pub.publish(b"c9/last", b"words")
        yield pub.close()
        message = yield inbox.get()
        return message

    assert run(bus, scenario) == Publish(b"c9/last", b"words")


def test_broker_closing_the_connection_fails_a_pending_whoami(bus, clients):
    client, _ = open_client(bus)

    def scenario():
        client.subscribe(b"!/cred/0/0/1/")  # not our credentials: the broker disconnects
        try:
            yield client.whoami()
        except SbusConnectionClosed as e:
            return e
        return None

    assert isinstance(run(bus, scenario), SbusConnectionClosed)
    assert client.closed


def test_nul_in_a_key_is_refused_before_sending(bus, clients):
    ((client, _),) = clients(1)
    with pytest.raises(ValueError, match="NUL"):
        bus.broker.call(client.publish, b"bad\x00key", b"x")
    assert bus.broker.call(client.whoami).startswith(b"!/cred/")  # still connected


def test_connecting_to_a_missing_path_fails_cleanly(bus):
    missing = os.path.join(tempfile.gettempdir(), f"sbus-missing-{os.getpid()}")
    with pytest.raises(FileNotFoundError):
        bus.broker.call(connect, bus.broker.reactor, missing)


def test_connecting_to_a_socket_nobody_accepts_on_is_refused(bus):
    directory = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    path = os.path.join(directory, "dead")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as bound:
            bound.bind(path)  # bound, never listening
            with pytest.raises(ConnectionRefusedError):
                bus.broker.call(connect, bus.broker.reactor, path)
    finally:
        os.unlink(path)
        os.rmdir(directory)


# -- a broker that breaks the protocol: a fake server on a real seqpacket socket -------------


class FakeSbusServer(FakeServer):
    """A broker that breaks the protocol: the client kit's fake server on a real unix
    seqpacket socket, sending each client ``packets`` as it connects."""

    def __init__(self, thread, *packets: bytes) -> None:
        super().__init__(thread, seqpacket=True)
        self.packets = packets

    def connected(self, conn) -> None:
        for packet in self.packets:
            conn.write(packet)


@pytest.mark.parametrize(
    "bad", [b"SUB a", b"UNSUB a", b"MSG no-nul", b"HELLO x", b"x" * 300], ids=repr
)
def test_malformed_server_packet_closes_the_connection(bus, bad):
    with FakeSbusServer(bus.broker.thread, bad) as server:
        inbox = Inbox()
        client = bus.broker.call(
            connect, bus.broker.reactor, server.path, on_message=inbox, max_packet=256
        )
        reason = bus.broker.call(client.when_closed)
        assert isinstance(reason, SbusConnectionClosed)
        assert "protocol error" in str(reason)
        assert server.wait(lambda: server.ended(0))
        assert inbox.items == []


def test_server_control_messages_go_to_on_control(bus):
    packets = (b"CMSG notice\0payload", b"CMSG !/cred/whoami\0!/cred/1/2/3", b"MSG k\0v")
    with FakeSbusServer(bus.broker.thread, *packets) as server:
        controls, messages = Inbox(), Inbox()
        client = bus.broker.call(
            connect, bus.broker.reactor, server.path, on_message=messages, on_control=controls
        )
        assert bus.broker.call(messages.get) == Publish(b"k", b"v")
        # an unasked whoami answer is a control message like any other
        assert controls.items == [
            ControlMessage(b"notice", b"payload"),
            ControlMessage(b"!/cred/whoami", b"!/cred/1/2/3"),
        ]
        bus.broker.call(client.close)
        assert server.wait(lambda: server.ended(0))


@pytest.fixture
def full_listener():
    """A listening socket whose accept queue is full: connecting says EAGAIN."""
    directory = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    path = os.path.join(directory, "full")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
    listener.bind(path)
    listener.listen(0)
    waiting = []
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
        waiting.append(sock)
        try:
            sock.connect(path)
        except BlockingIOError:
            break
        assert len(waiting) < 100, "the accept queue never filled"
    yield listener, path
    for sock in waiting:
        sock.close()
    listener.close()
    os.unlink(path)
    os.rmdir(directory)


def test_connect_waits_while_the_accept_queue_is_full(bus, full_listener):
    listener, path = full_listener

    def scenario():
        d = connect(bus.broker.reactor, path)  # the first try said EAGAIN: it tries again
        pending = []
        while True:  # the "broker" accepts: there is room again
            try:
                pending.append(listener.accept()[0])
            except BlockingIOError:
                break
        client = yield d
        yield client.close()
        for conn in pending:
            conn.close()
        return client, len(pending)

    client, accepted = run(bus, scenario)
    assert accepted >= 1 and client.closed


def test_connect_gives_up_after_its_timeout_when_nobody_accepts(bus, full_listener):
    _, path = full_listener
    with pytest.raises(TimeoutError, match="accepted nobody"):
        # (call's own timeout keyword is the wait for the result: pass connect's in a lambda)
        bus.broker.call(lambda: connect(bus.broker.reactor, path, timeout=0.05))
