"""Slow consumers over real sockets: a subscriber that stops reading never stalls the
publisher or the other subscribers; its backlog is bounded and the policy applies."""

from __future__ import annotations

import socket

from twisted.internet import defer, protocol, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial import unittest

from msgbroker import Broker, BrokerConfig, Listener, hookimpl
from msgbroker.service import BrokerService

PAYLOAD = b"x" * 1000
# ~6 MB: beyond what the kernel buffers for the stalled socket (tcp_wmem autotunes up to
# 4 MiB on the sending side) plus the broker's budget
COUNT = 6000


class Counter(protocol.Protocol):
    """Logs in, subscribes, and fires ``done`` once ``expect`` bytes arrived."""

    def __init__(self, identity, setup, expect, keep=4096):
        self.keep = keep
        self.identity = identity
        self.setup = setup
        self.expect = expect
        self.received = 0
        self.data = b""
        self.done = defer.Deferred()

    def connectionMade(self):
        self.transport.write(b"LOGIN %s open\n%s" % (self.identity, self.setup))

    def dataReceived(self, data):
        self.received += len(data)
        if len(self.data) < self.keep:
            self.data += data
        if self.received >= self.expect and not self.done.called:
            self.done.callback(self.received)


class CloseWatcher:
    def __init__(self):
        self.closed = {}

    @hookimpl
    def msgbroker_session_closed(self, session, reason):
        d = self.closed.setdefault(session.identity, defer.Deferred())
        if not d.called:
            d.callback(reason)

    def wait(self, identity):
        return self.closed.setdefault(identity, defer.Deferred())


class SlowConsumerTests(unittest.TestCase):
    timeout = 60

    def start(self, **config):
        self.watcher = CloseWatcher()
        plugins = [self.watcher]

        class TestBroker(Broker):
            def __init__(self, config, reactor):
                super().__init__(config, reactor, plugins=plugins)

        self.service = BrokerService(
            BrokerConfig(
                listeners=(Listener("ssmp", "tcp:0:interface=127.0.0.1"),),
                auth=("open",),
                **config,
            ),
            reactor,
            broker_class=TestBroker,
        )
        self.service.startService()
        self.addCleanup(self.service.stopService)
        self.port = int(self.service.broker.listening[0][1].rsplit(":", 1)[1])

    @defer.inlineCallbacks
    def connect(self, proto):
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port)
        p = yield connectProtocol(endpoint, proto)
        self.addCleanup(p.transport.loseConnection)
        return p

    def stalled_subscriber(self):
        """A raw socket with a tiny receive buffer that subscribes and never reads again."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", self.port))
        sock.sendall(b"LOGIN stalled open\nSUBSCRIBE t\n")
        self.addCleanup(sock.close)
        return sock

    @defer.inlineCallbacks
    def run_scenario(self):
        frame = b"MCAST t " + PAYLOAD + b"\n"
        delivery = len(b"000 pub ") + len(frame)
        presence = yield self.connect(
            Counter(b"presence", b"SUBSCRIBE t PRESENCE\n", 0, keep=1 << 30)
        )
        fast = yield self.connect(Counter(b"fast", b"SUBSCRIBE t\n", len(b"200\n200\n")))
        yield fast.done
        stalled = self.stalled_subscriber()
        # wait until the broker has the stalled subscription (its SUBSCRIBE event arrives)
        while b"000 stalled SUBSCRIBE t\n" not in presence.data:
            d = defer.Deferred()
            reactor.callLater(0.01, d.callback, None)  # poll the real reactor, not a sleep
            yield d
        fast.expect = fast.received + COUNT * delivery
        fast.done = defer.Deferred()
        publisher = yield self.connect(Counter(b"pub", frame * COUNT, len(b"200\n") * (COUNT + 1)))
        yield publisher.done
        yield fast.done
        return presence, fast, publisher, stalled

    @defer.inlineCallbacks
    def test_disconnect_policy_closes_only_the_stalled_subscriber(self):
        self.start(max_backlog=256 * 1024)
        presence, fast, publisher, _ = yield self.run_scenario()
        reason = yield self.watcher.wait("stalled")
        self.assertEqual(reason, "slow consumer")
        self.assertTrue(b"000 stalled UNSUBSCRIBE t\n" in presence.data, "no UNSUBSCRIBE event")
        self.assertGreaterEqual(fast.received, COUNT * (len(PAYLOAD) + 16))
        self.assertEqual(self.service.broker.hub.stats.dropped, 1)
        self.assertNotIn("fast", self.watcher.closed)
        self.assertNotIn("pub", self.watcher.closed)

    @defer.inlineCallbacks
    def test_drop_policy_keeps_the_connection_and_counts_drops(self):
        self.start(max_backlog=256 * 1024, slow_consumer="drop")
        _, fast, publisher, _ = yield self.run_scenario()
        broker = self.service.broker
        stalled = next(s for s in broker.sessions if s.identity == "stalled")
        self.assertTrue(stalled.output.paused)
        self.assertGreater(stalled.dropped, 0)
        self.assertLessEqual(stalled.output.held_bytes, 256 * 1024)
        self.assertEqual(broker.hub.stats.dropped, stalled.dropped)
        self.assertNotIn("stalled", self.watcher.closed)
