"""LeanServer: a listener's TCP connections keep no log prefix, repr or fileno of their own,
and make each when asked, as Twisted's tcp.Server would have stored it."""

from __future__ import annotations

from twisted.internet import defer, reactor, tcp, threads
from twisted.trial import unittest

from msgbroker.tcpserver import LeanServer, use_lean_server

from .test_service import blocking_session, make_service, port_of


class LeanServerTests(unittest.TestCase):
    timeout = 20

    @defer.inlineCallbacks
    def test_connections_are_lean_and_answer_as_twisted_would(self):
        service = make_service()
        service.startService()
        port = port_of(service)
        sock, got = yield threads.deferToThread(
            blocking_session, port, b"LOGIN alice open\nPING\n", b"000 . PONG\n"
        )
        self.assertEqual(got, b"200\n000 . PONG\n")
        (session,) = service.broker.sessions
        transport = session.output.transport
        self.assertIsInstance(transport, LeanServer)
        stored = vars(transport)
        self.assertNotIn("logstr", stored)
        self.assertNotIn("repstr", stored)
        self.assertNotIn("fileno", stored)
        client_port = sock.getsockname()[1]
        self.assertEqual(transport.getPeer().port, client_port)
        self.assertEqual(
            transport.logPrefix(), f"StreamProtocol,{transport.sessionno},127.0.0.1"
        )
        self.assertEqual(repr(transport), f"<StreamProtocol #{transport.sessionno} on {port}>")
        self.assertEqual(transport.fileno(), transport.socket.fileno())
        self.assertIn(transport, reactor.getReaders())
        lost = defer.Deferred()
        session.on_lost.append(lambda: lost.callback(None))
        sock.close()
        yield lost
        self.assertEqual(transport.fileno(), -1)  # as Twisted's own, once closed
        self.assertNotIn(transport, reactor.getReaders())
        yield service.stopService()

    def test_only_a_plain_tcp_port_changes(self):
        class Other:
            transport = tcp.Server

        other = Other()
        use_lean_server(other)
        self.assertIs(other.transport, tcp.Server)
