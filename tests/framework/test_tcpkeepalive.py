"""TCP keepalive for protocols without a heartbeat: the probe timings derived from
``keepalive``, the socket found under a transport (or none), and the server session flag
that turns the idle timer off and the kernel's probes on (real sockets: tests/mm2)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from msgbroker import BrokerConfig, ProtocolSpec, hookimpl
from msgbroker.connection import ServerSession
from msgbroker.tcpkeepalive import PROBES, keepalive_probes, tcp_socket
from msgbroker.testing import connect, drive, make_broker


@given(st.floats(0.001, 1e6))
def test_a_dead_peer_is_given_up_on_about_keepalive_after_the_first_probe(interval):
    idle, every, count = keepalive_probes(interval)
    assert count == PROBES
    if interval <= 32767:
        assert idle == max(1, -(-interval // 1))  # the first probe after keepalive s (rounded up)
        # the other protocols close a silent peer keepalive s after their ping; the
        # probes take as long, never less, at most a few whole seconds more
        assert max(interval, 1) <= every * count < max(interval, 1) + count
    else:  # Linux takes at most 32767 s for either
        assert idle == 32767
        assert every <= 32767


def test_the_default_keepalive_gives_30_10_3():
    assert keepalive_probes(30.0) == (30, 10, 3)


class SilentSession(ServerSession):
    """A toy protocol without a ping: any input logs it in; it answers nothing."""

    name = "silent"
    encode = staticmethod(lambda message: message.payload)
    heartbeat = False

    def data_received(self, data):
        if self.peer.identity is None:
            self.peer.identity = "quiet"
            self.logged_in()


class SilentPlugin:
    @hookimpl
    def msgbroker_register_protocols(self, register):
        register(ProtocolSpec(name="silent", session=SilentSession))


def test_without_a_heartbeat_a_silent_peer_is_never_timed_out():
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30), plugins=[SilentPlugin()])
    driver = drive(broker, "silent")
    driver.feed(b"hello")
    assert driver.server.keepalive is None
    assert driver.timers.deadline is None  # the login timer is gone, and no idle timer came
    driver.advance(24 * 3600)
    assert not driver.closed


def test_an_in_memory_transport_has_no_socket_and_is_left_alone():
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[SilentPlugin()])
    conn = connect(broker, "silent")  # a StringTransport: nothing to set, nothing raised
    assert tcp_socket(conn.transport) is None
    assert not conn.closed
