"""The SSMP client library against a real broker over real sockets (and, for timers and a
misbehaving server, against a Clock or a scripted fake server)."""

from __future__ import annotations

import socket
import time

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock

from msgbroker.clientkit.testing import WAIT, FakeServer, MemoryWire
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.ssmp.client import (
    BlockingSSMPClient,
    Delivery,
    Presence,
    SSMPClientProtocol,
    SSMPConnectionClosed,
    SSMPError,
    connect,
)
from tests.ssmp.e2e_support import Inbox, reactor_thread, running_broker


class ScriptedServer(FakeServer):
    """A fake SSMP server on a loopback port: it accepts one connection, answers its first
    line (the LOGIN) with ``200`` followed by ``script``, then records what the client sends
    until the client closes."""

    def __init__(self, script: bytes = b"") -> None:
        super().__init__(reactor_thread())
        self.script = script
        self.sent_to_it = b""
        self.start()

    def connected(self, conn):
        self.stop_listening()

    def received(self, conn, data):
        answered = b"\n" in self.sent_to_it
        self.sent_to_it += data
        if not answered and b"\n" in self.sent_to_it:
            conn.write(b"200\n" + self.script)

    def wait_closed(self, timeout: float = WAIT) -> bytes:
        """Wait until the client closed the connection; what it sent."""
        self.wait(lambda: self.ended(0), timeout)
        return self.sent_to_it


@pytest.fixture
def broker():
    with running_broker(auth=("open",)) as running:
        yield running


def twisted_client(broker, identity, **options):
    """Connect and log in from the reactor thread; the logged-in protocol."""
    return broker.call(connect, broker.reactor, broker.host, broker.port, identity=identity,
                       **options)


# -- Twisted client ----------------------------------------------------------------------------


def test_twisted_login_subscribe_and_mcast_delivery(broker):
    inbox = Inbox()
    bob = twisted_client(broker, "bob", on_message=inbox)
    alice = twisted_client(broker, "alice")
    assert bob.identity == "bob"
    assert broker.call(bob.subscribe, "news") is None
    assert broker.call(alice.mcast, "news", b"hello") is None
    assert broker.call(inbox.get) == Delivery("alice", "MCAST", "news", b"hello")


def test_twisted_binary_payload_round_trips(broker):
    inbox = Inbox()
    bob = twisted_client(broker, "bob", on_message=inbox)
    alice = twisted_client(broker, "alice")
    broker.call(bob.subscribe, "bin")
    payload = b"\x00\x01line\nbreak\xff" + bytes(range(256)) * 3
    broker.call(alice.mcast, "bin", payload[:1024])
    assert broker.call(inbox.get).payload == payload[:1024]


def test_twisted_ucast_and_bcast(broker):
    inbox = Inbox()
    bob = twisted_client(broker, "bob", on_message=inbox)
    alice = twisted_client(broker, "alice")
    broker.call(bob.subscribe, "shared")
    broker.call(alice.subscribe, "shared")
    broker.call(alice.ucast, "bob", b"just you")
    assert broker.call(inbox.get) == Delivery("alice", "UCAST", "bob", b"just you")
    broker.call(alice.bcast, b"everyone")
    assert broker.call(inbox.get) == Delivery("alice", "BCAST", None, b"everyone")


def test_twisted_presence_events(broker):
    events = Inbox()
    carol = twisted_client(broker, "carol")
    broker.call(carol.subscribe, "room")
    watcher = twisted_client(broker, "watcher", on_presence=events)
    broker.call(watcher.subscribe, "room", presence=True)
    assert broker.call(events.get) == Presence("carol", "room", subscribed=True, presence=False)
    dave = twisted_client(broker, "dave")
    broker.call(dave.subscribe, "room", presence=True)
    assert broker.call(events.get) == Presence("dave", "room", subscribed=True, presence=True)
    broker.call(dave.unsubscribe, "room")
    assert broker.call(events.get) == Presence("dave", "room", subscribed=False, presence=False)
    broker.call(carol.close)
    assert broker.call(events.get) == Presence("carol", "room", subscribed=False, presence=False)


def test_twisted_error_replies_are_ssmp_errors_and_the_connection_stays_open(broker):
    alice = twisted_client(broker, "alice")
    with pytest.raises(SSMPError) as not_found:
        broker.call(alice.ucast, "nobody", b"hi")
    assert not_found.value.code == 404
    with pytest.raises(SSMPError) as not_subscribed:
        broker.call(alice.unsubscribe, "never")
    assert not_subscribed.value.code == 404
    broker.call(alice.subscribe, "t")
    with pytest.raises(SSMPError) as twice:
        broker.call(alice.subscribe, "t")
    assert twice.value.code == 409
    anonymous = twisted_client(broker, ".")
    with pytest.raises(SSMPError) as not_allowed:
        broker.call(anonymous.subscribe, "t")
    assert not_allowed.value.code == 405
    assert broker.call(alice.ping) is None
    assert broker.call(anonymous.ping) is None


def test_twisted_replies_are_matched_to_pipelined_requests_in_order(broker):
    alice = twisted_client(broker, "alice")

    def pipeline():
        requests = [
            alice.subscribe("a"),
            alice.subscribe("a"),
            alice.ucast("nobody", b"x"),
            alice.mcast("a", b"y"),
            alice.unsubscribe("b"),
        ]
        return defer.DeferredList(requests, consumeErrors=True)

    outcomes = broker.call(pipeline)
    codes = [200 if ok else value.value.code for ok, value in outcomes]
    assert codes == [200, 409, 404, 200, 404]


def test_twisted_refused_login_is_401_with_the_schemes_and_closes(broker):
    with pytest.raises(SSMPError) as refused:
        twisted_client(broker, "alice", scheme="secret", credential=b"guess")
    assert refused.value.code == 401
    assert refused.value.payload == b"open"


def test_twisted_ping_is_answered_by_pong(broker):
    alice = twisted_client(broker, "alice")
    assert broker.call(alice.ping) is None


def test_twisted_close_fires_when_the_connection_is_gone(broker):
    alice = twisted_client(broker, "alice")
    assert broker.call(alice.close) is None
    with pytest.raises(SSMPConnectionClosed):
        broker.call(alice.mcast, "t", b"late")


class CountingPings(SSMPClientProtocol):
    """Fires ``self.pinged`` at the third server PING it has answered."""

    def __init__(self, **options):
        super().__init__(**options)
        self.pinged = defer.Deferred()

    def dataReceived(self, data):
        super().dataReceived(data)
        if self.pings_answered >= 3 and not self.pinged.called:
            self.pinged.callback(self.pings_answered)


def test_twisted_client_answers_server_pings_so_the_broker_keeps_it():
    # the broker pings after 0.2 s of silence and closes 0.2 s later without a request; a
    # third PING proves the first two were answered
    with running_broker(auth=("open",), keepalive=0.2) as broker:
        alice = twisted_client(broker, "alice", keepalive=None, protocol_class=CountingPings)
        assert broker.call(lambda: alice.pinged) >= 3
        assert broker.call(alice.ping) is None


def test_twisted_keepalive_ping_after_idle_then_pong_keeps_the_connection(broker):
    clock = Clock()
    pongs = Inbox()

    class Watching(SSMPClientProtocol):
        def dataReceived(self, data):
            super().dataReceived(data)
            if b"000 . PONG\n" in data:
                pongs(data)

    alice = twisted_client(broker, "alice", clock=clock, protocol_class=Watching)

    def advance(seconds):
        """Advance the clock; when the client last pinged (read in the reactor thread, before
        a PONG can arrive)."""
        clock.advance(seconds)
        return alice.session.pinged_at

    assert broker.call(advance, 29.9) is None  # not idle long enough yet
    assert broker.call(advance, 0.1) == 30.0  # PING sent
    broker.call(pongs.get)  # the broker's PONG arrived
    assert alice.session.pinged_at is None
    assert broker.call(advance, 30) == 60.0  # idle again: a new PING, no close
    assert not alice.closed
    broker.call(pongs.get)
    assert broker.call(alice.ping) is None


# In memory, with a Clock: what the client does when the server misbehaves.


def memory_client(**options):
    clock = Clock()
    wire = MemoryWire(SSMPClientProtocol(clock=clock, **options), clock)
    return wire.proto, wire.transport, clock


def test_keepalive_closes_when_no_pong_follows_the_ping():
    proto, transport, clock = memory_client()
    pending = proto.mcast("t", b"x")
    failures = []
    pending.addErrback(failures.append)
    transport.clear()
    proto.dataReceived(b"200\n")
    clock.advance(30)
    assert transport.value() == b"PING\n"
    clock.advance(29.9)
    assert not transport.disconnecting
    waiting = proto.subscribe("u")
    waiting.addErrback(failures.append)
    clock.advance(0.1)
    assert transport.disconnecting
    assert len(failures) == 1
    assert failures[0].check(SSMPConnectionClosed)
    assert "no PONG" in failures[0].getErrorMessage()


def test_keepalive_is_configurable_and_any_server_data_postpones_it():
    proto, transport, clock = memory_client(keepalive=5)
    clock.advance(4)
    proto.dataReceived(b"000 . PING\n")
    assert transport.value() == b"PONG\n"
    transport.clear()
    clock.advance(4.9)
    assert transport.value() == b""
    clock.advance(0.1)
    assert transport.value() == b"PING\n"


def test_server_ping_event_is_answered_with_pong():
    proto, transport, _ = memory_client()
    proto.dataReceived(b"000 . PING\n")
    assert transport.value() == b"PONG\n"
    assert proto.pings_answered == 1


@pytest.mark.parametrize(
    "garbage",
    [b"000 bob FROB news x\n", b"20\n", b"000 bob MCAST news\n", b"200 \n"],
    ids=["unknown-event", "short-code", "mcast-without-payload", "empty-payload"],
)
def test_grammar_error_from_the_server_closes_and_fails_pending(garbage):
    proto, transport, _ = memory_client()
    failures = []
    proto.subscribe("t").addErrback(failures.append)
    proto.dataReceived(garbage)
    assert transport.disconnecting
    assert failures[0].check(RemoteProtocolError)


def test_twisted_client_closes_on_an_unknown_event_over_a_real_socket():
    server = ScriptedServer(b"000 bob FROB news\n")
    with running_broker(auth=("open",)) as broker:
        proto = broker.call(connect, broker.reactor, server.host, server.port, identity="a")
        sent = server.wait_closed()
        assert sent == b"LOGIN a open\n"
        assert isinstance(broker.call(proto.when_closed), RemoteProtocolError)


# -- blocking client ---------------------------------------------------------------------------


def test_blocking_subscribe_mcast_ucast_bcast(broker):
    with BlockingSSMPClient(broker.host, broker.port, "bob") as bob, \
            BlockingSSMPClient(broker.host, broker.port, "alice") as alice:
        bob.subscribe("news")
        alice.subscribe("news")
        payload = b"\x02binary\nbytes"
        alice.mcast("news", payload)
        assert bob.next_event(timeout=10) == Delivery("alice", "MCAST", "news", payload)
        alice.ucast("bob", b"direct")
        assert bob.next_event(timeout=10) == Delivery("alice", "UCAST", "bob", b"direct")
        alice.bcast(b"all")
        assert bob.next_event(timeout=10) == Delivery("alice", "BCAST", None, b"all")


def test_blocking_events_arriving_while_waiting_for_a_reply_are_queued(broker):
    with BlockingSSMPClient(broker.host, broker.port, "bob") as bob, \
            BlockingSSMPClient(broker.host, broker.port, "alice") as alice:
        bob.subscribe("news")
        for n in range(3):
            alice.mcast("news", b"m%d" % n)
        # the broker wrote the three deliveries to bob before answering alice, so bob's
        # next reply comes after them: reading it queues them
        bob.subscribe("other")
        queued = [bob.next_event(timeout=0) for _ in range(3)]
        assert [e.payload for e in queued] == [b"m0", b"m1", b"m2"]
        assert bob.next_event(timeout=0) is None


def test_blocking_presence_events(broker):
    with BlockingSSMPClient(broker.host, broker.port, "watcher") as watcher:
        watcher.subscribe("room", presence=True)
        with BlockingSSMPClient(broker.host, broker.port, "carol") as carol:
            carol.subscribe("room")
            assert watcher.next_event(timeout=10) == Presence("carol", "room", True, False)
        assert watcher.next_event(timeout=10) == Presence("carol", "room", False, False)


def test_blocking_error_replies_raise_ssmp_error(broker):
    with BlockingSSMPClient(broker.host, broker.port, "alice") as alice:
        with pytest.raises(SSMPError) as not_found:
            alice.ucast("nobody", b"x")
        assert not_found.value.code == 404
        alice.subscribe("t")
        with pytest.raises(SSMPError) as twice:
            alice.subscribe("t")
        assert twice.value.code == 409
        alice.ping()  # still usable
    with BlockingSSMPClient(broker.host, broker.port, ".") as anonymous:
        with pytest.raises(SSMPError) as not_allowed:
            anonymous.subscribe("t")
        assert not_allowed.value.code == 405
        with pytest.raises(SSMPError) as bcast:
            anonymous.bcast(b"x")
        assert bcast.value.code == 405


def test_blocking_refused_login_raises_401_with_the_schemes(broker):
    with pytest.raises(SSMPError) as refused:
        BlockingSSMPClient(broker.host, broker.port, "alice", "cert")
    assert refused.value.code == 401
    assert refused.value.payload == b"open"


def test_blocking_close_ends_the_connection(broker):
    with BlockingSSMPClient(broker.host, broker.port, "watcher") as watcher:
        watcher.subscribe("room", presence=True)
        alice = BlockingSSMPClient(broker.host, broker.port, "alice")
        alice.subscribe("room")
        watcher.next_event(timeout=10)
        alice.close()
        assert alice.closed
        assert watcher.next_event(timeout=10) == Presence("alice", "room", False, False)
        with pytest.raises(SSMPConnectionClosed):
            alice.mcast("room", b"late")
        alice.close()  # again: nothing


def test_blocking_next_event_raises_when_the_broker_closes(broker):
    with BlockingSSMPClient(broker.host, broker.port, "alice") as first:
        BlockingSSMPClient(broker.host, broker.port, "alice").close()  # kicks the first
        with pytest.raises(SSMPConnectionClosed):
            first.next_event(timeout=10)


def test_blocking_client_answers_server_pings():
    with running_broker(auth=("open",), keepalive=0.2) as broker, \
            BlockingSSMPClient(broker.host, broker.port, "alice", keepalive=None) as alice:
        deadline = time.monotonic() + 10
        while alice.pings_answered < 3:  # reading answers them; the third proves the others
            assert time.monotonic() < deadline
            assert alice.next_event(timeout=0.05) is None
        alice.ping()


def test_blocking_keepalive_pings_when_idle_and_gives_up_without_pong():
    server = ScriptedServer()  # answers the LOGIN, then never says anything
    client = BlockingSSMPClient(server.host, server.port, "alice", keepalive=0.2)
    with pytest.raises(SSMPConnectionClosed, match=r"no PONG within 0\.2 s"):
        client.next_event(timeout=10)
    assert server.wait_closed() == b"LOGIN alice open\nPING\n"


def test_blocking_keepalive_pong_keeps_the_connection(broker):
    with BlockingSSMPClient(broker.host, broker.port, "alice", keepalive=0.1) as alice:
        # five keepalive intervals: it pinged and got its PONGs (else it would have closed)
        assert alice.next_event(timeout=0.5) is None
        assert alice.pings_sent >= 2
        alice.ping()


def test_blocking_client_closes_on_an_unknown_event():
    server = ScriptedServer(b"000 bob FROB news\n")  # right after the 200 to LOGIN
    with pytest.raises(SSMPConnectionClosed, match="protocol error"):
        BlockingSSMPClient(server.host, server.port, "alice")
    assert server.wait_closed() == b"LOGIN alice open\n"


def test_blocking_connection_refused_is_an_os_error():
    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ConnectionRefusedError):
            BlockingSSMPClient("127.0.0.1", bound.getsockname()[1], "a")
