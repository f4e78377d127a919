"""BrokerService over real sockets: listeners, started/stopped hooks, shutdown events."""

from __future__ import annotations

import socket

from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from msgbroker import Broker, BrokerConfig, ConfigError, Listener, hookimpl
from msgbroker.service import BrokerService


class Recorder:
    def __init__(self):
        self.events = []

    @hookimpl
    def msgbroker_broker_started(self, broker):
        self.events.append(("started", [address for _, address in broker.listening]))

    @hookimpl
    def msgbroker_broker_stopped(self, broker):
        self.events.append(("stopped", len(broker.sessions)))


def make_service(recorder=None, **config):
    config.setdefault("listeners", (Listener("ssmp", "tcp:0:interface=127.0.0.1"),))
    config.setdefault("auth", ("open",))
    plugins = [recorder] if recorder else []

    class TestBroker(Broker):
        def __init__(self, config, reactor):
            super().__init__(config, reactor, plugins=plugins)

    return BrokerService(BrokerConfig(**config), reactor, broker_class=TestBroker)


def port_of(service):
    address = service.broker.listening[0][1]
    return int(address.rsplit(":", 1)[1])


def blocking_session(port, lines, expect):
    """In a thread: connect, send ``lines``, read until ``expect`` bytes arrived."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(lines)
    data = b""
    while not data.endswith(expect):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return sock, data


class ServiceTests(unittest.TestCase):
    timeout = 20

    @defer.inlineCallbacks
    def test_port_zero_resolves_to_real_port_and_hooks_fire(self):
        rec = Recorder()
        service = make_service(rec)
        service.startService()
        port = port_of(service)
        self.assertNotEqual(port, 0)
        self.assertEqual(rec.events, [("started", [f"tcp:127.0.0.1:{port}"])])
        yield service.stopService()
        self.assertEqual(rec.events[-1], ("stopped", 0))

    def test_listen_failure_is_a_config_error(self):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        self.addCleanup(holder.close)
        busy = holder.getsockname()[1]
        service = make_service(listeners=(Listener("ssmp", f"tcp:{busy}:interface=127.0.0.1"),))
        with self.assertRaises(ConfigError) as caught:
            service.startService()
        self.assertIn(f"cannot listen on ssmp=tcp:{busy}", str(caught.exception))

    def test_unknown_protocol_and_bad_endpoint_are_config_errors(self):
        with self.assertRaises(ConfigError):
            make_service(listeners=(Listener("nope", "tcp:0"),))
        with self.assertRaises(ConfigError):
            make_service(listeners=(Listener("ssmp", "carrier-pigeon:4"),))

    @defer.inlineCallbacks
    def test_shutdown_sends_unsubscribe_events_before_closing(self):
        service = make_service()
        service.startService()
        port = port_of(service)
        watcher, got = yield threads.deferToThread(
            blocking_session, port, b"LOGIN w open\nSUBSCRIBE t PRESENCE\n", b"200\n200\n"
        )
        self.addCleanup(watcher.close)
        member, got = yield threads.deferToThread(
            blocking_session, port, b"LOGIN m open\nSUBSCRIBE t\n", b"200\n200\n"
        )
        self.addCleanup(member.close)
        yield service.stopService()

        def read_all(sock):
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            return data

        watcher_rest = yield threads.deferToThread(read_all, watcher)
        member_rest = yield threads.deferToThread(read_all, member)
        # newest first: m leaves while w is still open, so w hears of it
        self.assertEqual(watcher_rest, b"000 m SUBSCRIBE t\n000 m UNSUBSCRIBE t\n")
        self.assertEqual(member_rest, b"")
        self.assertEqual(service.broker.sessions, {})
