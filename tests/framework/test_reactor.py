"""msgbroker.reactor.BrokerReactor: the epoll reactor twistd msgbroker runs on, on real
sockets: events handled, then the end-of-poll calls, which never wait for a poll to block."""

from __future__ import annotations

import subprocess
import sys

from twisted.internet.protocol import ClientFactory, Factory, Protocol

from msgbroker.reactor import BrokerReactor

FAILSAFE = 10.0  # seconds: a reactor that hangs stops here and the test fails


class Echo(Protocol):
    def dataReceived(self, data):
        order.append(("read", data))
        self.transport.write(data)
        reactor = self.factory.reactor
        reactor.call_after_poll(lambda: order.append(("after poll", data)))


class Client(Protocol):
    def connectionMade(self):
        self.transport.write(b"ping")

    def dataReceived(self, data):
        order.append(("echoed", data))
        self.factory.reactor.stop()


order: list = []


def run(reactor, timeout=FAILSAFE):
    stopped_by = []
    reactor.callLater(timeout, lambda: (stopped_by.append("failsafe"), reactor.stop()))
    reactor.run(installSignalHandlers=False)
    return stopped_by


def test_events_are_handled_then_the_calls_for_the_end_of_the_poll():
    order.clear()
    reactor = BrokerReactor()
    server = Factory.forProtocol(Echo)
    server.reactor = reactor
    port = reactor.listenTCP(0, server, interface="127.0.0.1")
    client = ClientFactory.forProtocol(Client)
    client.reactor = reactor
    reactor.connectTCP("127.0.0.1", port.getHost().port, client)
    assert run(reactor) == []
    assert order == [("read", b"ping"), ("after poll", b"ping"), ("echoed", b"ping")]


def test_a_call_registered_from_a_timer_runs_without_waiting_for_input():
    reactor = BrokerReactor()
    ran = []

    def later():
        reactor.call_after_poll(lambda: (ran.append(True), reactor.stop()))

    reactor.callLater(0.001, later)
    assert run(reactor) == []  # no input came: the poll did not block
    assert ran == [True]


def test_a_failing_call_is_logged_and_the_others_still_run():
    reactor = BrokerReactor()
    ran = []

    def fail():
        raise RuntimeError("boom")

    def register():
        reactor.call_after_poll(fail)
        reactor.call_after_poll(lambda: (ran.append(True), reactor.stop()))

    reactor.callLater(0, register)
    assert run(reactor) == []
    assert ran == [True]


def test_install_makes_it_the_global_reactor_unless_one_is_installed():
    code = (
        "from msgbroker.reactor import install; r = install(); "
        "from twisted.internet import reactor; "
        "print(type(reactor).__name__, r is reactor, install())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["BrokerReactor", "True", "None"]
