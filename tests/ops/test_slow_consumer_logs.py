"""One info line for every slow consumer, on every protocol: a real broker process, a
subscriber of each protocol that stops reading, and a publisher that keeps publishing
until the broker's log says it disconnected (or dropped for) that subscriber."""

from __future__ import annotations

import contextlib
import threading

import pytest

from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from tests.abuse.harness import WAIT, BrokerProcess, read_exactly, ssmp_connect

PAYLOAD = b"y" * 1000


def subscriber(broker, protocol):
    """A subscriber of ``protocol`` to the topic ``t``, identity ``slow``; it never reads."""
    if protocol == "ssmp":
        sock = ssmp_connect(broker.tcp("ssmp"), b"slow")
        sock.sendall(b"SUBSCRIBE t\n")
        assert read_exactly(sock, 4) == b"200\n"
        return sock
    if protocol in ("stmp", "stmp-ws"):
        client = BlockingSTMPClient(
            *broker.tcp(protocol), identity="slow", ws=protocol == "stmp-ws", heartbeat=None
        )
        client.subscribe("t")
        return client
    if protocol == "mm2":
        client = BlockingMM2Client(*broker.tcp("mm2"), identity="slow")
        client.subscribe("t")
        return client
    client = BlockingSbusClient(broker.addresses["sbus"].removeprefix("unix:"), timeout=WAIT)
    client.subscribe(b"t")
    client.sync()
    return client


class Flood:
    """An SSMP publisher on ``t`` in a thread, until :meth:`stop`."""

    def __init__(self, broker):
        self.sock = ssmp_connect(broker.tcp("ssmp"), b"flood")
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        batch = b"MCAST t %s\n" % PAYLOAD * 50
        with contextlib.suppress(OSError):
            while not self.stopped.is_set():
                self.sock.sendall(batch)
                read_exactly(self.sock, 200)

    def stop(self):
        self.stopped.set()
        self.thread.join(WAIT)
        self.sock.close()


@pytest.mark.parametrize("protocol", ["ssmp", "stmp", "stmp-ws", "mm2", "sbus"])
@pytest.mark.parametrize("policy", ["disconnect", "drop"])
def test_a_slow_consumer_is_logged_on_every_protocol(protocol, policy):
    broker = BrokerProcess("--max-backlog", "256K", "--slow-consumer", policy)
    name = "stmp" if protocol == "stmp-ws" else protocol  # STMP, over a WebSocket
    try:
        slow = subscriber(broker, protocol)
        flood = Flood(broker)
        try:
            if policy == "disconnect":
                line = broker.log.wait_for(rf"slow {name} consumer (\S+) .* disconnected")
                who = line.group(1)
            else:
                line = broker.log.wait_for(rf"slow {name} consumer (\S+) .*deliveries dropped")
                who = line.group(1)
        finally:
            flood.stop()
        # sbus clients are known by their credentials
        assert who == "slow" if protocol != "sbus" else who.startswith("sbus:")
        assert "[msgbroker#info]" in line.string
        slow.close()
        broker.assert_no_traceback()
    finally:
        broker.stop()
