"""The ACL end to end, over real sockets: one broker with every protocol (SSMP also over TLS
with client certificates made here) and an ACL file. Each protocol's "not allowed" answer
(SSMP 405 and STMP 0x23 keeping the connection, Micromessage2's ERROR frame and close, the
sbus disconnect), rules per identity, per certificate name and per pattern, default deny,
across protocols, and a reload of the file on a running broker.

Absence is proven without waiting for a silence: a peer's ``sync()`` unicasts a marker to
itself (the ACL file lets everyone do that) and returns what arrived before it.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

import pytest

from msgbroker import BrokerConfig, ConfigError, Listener
from msgbroker.filters import Filter, Op
from msgbroker.plugins.mm2 import codec as mm2
from msgbroker.plugins.mm2.codec import Subscribe
from msgbroker.plugins.ssmp.client import BlockingSSMPClient, SSMPError
from msgbroker.plugins.stmp.codec import Status
from tests.certs import make_pki
from tests.interop.mm2_peer import MM2Peer
from tests.interop.peers import Closed, Event, Refused, SSMPPeer, STMPPeer, STMPWebSocketPeer
from tests.interop.sbus_peer import UNKNOWN, SbusPeer
from tests.ssmp.e2e_support import running_broker

UID = os.getuid()
ACL = f"""\
# the anonymous identity may do nothing: no line before the first user
user alice
topic readwrite chat/
topic deny chat/admin/
topic unicast bob
topic broadcast
user bob
topic read chat/
user sbus:{UID}:*
topic read chat/
topic write sensors/
cert device-17.example.com
topic publish sensors/17/
# everyone: their own corner, unicasts to themselves (how the test peers sync), and the
# sbus peers' private keys (their barriers)
pattern readwrite users/%u/
pattern unicast %u
pattern readwrite !/cred/
"""
PEERS = {"ssmp": SSMPPeer, "stmp": STMPPeer, "stmp-ws": STMPWebSocketPeer, "mm2": MM2Peer}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(pki, tmp_path_factory):
    acl = tmp_path_factory.mktemp("acl") / "acl"
    acl.write_text(ACL)
    with tempfile.TemporaryDirectory(prefix="acl-", dir="/tmp") as folder:  # a short path
        listeners = (
            "ssmp=tcp:0:interface=127.0.0.1",
            "stmp=tcp:0:interface=127.0.0.1",
            "stmp-ws=tcp:0:interface=127.0.0.1",
            "mm2=tcp:0:interface=127.0.0.1",
            f"sbus=unix:{folder}/bus",
            "ssmp=tls:0:interface=127.0.0.1",
        )
        with running_broker(
            listeners,
            auth=("open",),
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.server.key),
            tls_ca=str(pki.ca.cert_path),
            sections={"acl": {"file": str(acl)}},
        ) as running:
            yield running


def address(broker, protocol: str, tls: bool = False) -> str:
    for listener, bound in broker.service.broker.listening:
        if listener.protocol == protocol and listener.is_tls is tls:
            return bound
    raise LookupError(protocol)


@pytest.fixture
def connect(broker):
    opened = []

    def open_peer(protocol: str, identity: str | None = None):
        peer = (SbusPeer if protocol == "sbus" else PEERS[protocol])(address(broker, protocol))
        opened.append(peer)
        if identity is not None:
            peer.login(identity)
        return peer

    yield open_peer
    for peer in opened:
        if not peer.closed:
            peer.close()


# -- each protocol's "not allowed" -------------------------------------------------------------


def test_ssmp_answers_405_and_keeps_the_connection(connect):
    alice, bob = connect("ssmp", "alice"), connect("ssmp", "bob")
    for request in (
        lambda: alice.publish("chat/admin/x", b"no"),
        lambda: alice.publish("news", b"no"),
        lambda: alice.subscribe("news"),
        lambda: alice.unicast("carol", b"no"),
    ):
        with pytest.raises(Refused) as refused:
            request()
        assert refused.value.code == 405
    alice.publish("chat/x", b"yes")  # still open, still allowed what the file says
    alice.broadcast(b"yes")
    alice.unicast("bob", b"yes")
    assert bob.sync() == [Event("alice", "ucast", None, b"yes")]


@pytest.mark.parametrize("protocol", ["stmp", "stmp-ws"])
def test_stmp_answers_forbidden_and_keeps_the_connection(connect, protocol):
    bob = connect(protocol, "bob")
    for request in (
        lambda: bob.publish("chat/x", b"no"),
        lambda: bob.subscribe("news"),
        lambda: bob.unicast("alice", b"no"),
        lambda: bob.broadcast(b"no"),
    ):
        with pytest.raises(Refused) as refused:
            request()
        assert refused.value.code == Status.FORBIDDEN
    bob.subscribe("chat/x")
    bob.publish("users/bob/notes", b"mine")


@pytest.mark.parametrize(
    ("request_frame", "text"),
    [
        (lambda peer: peer._message("chat/x", b"no"), "not allowed to publish to 'chat/x'"),
        (lambda peer: peer._message("@alice", b"no"), "not allowed to unicast to 'alice'"),
        (lambda peer: _mm2_subscribe("news"), "not allowed to subscribe to 'news'"),
        (lambda peer: _mm2_subscribe("news", queue="g"), "not allowed to subscribe to 'news'"),
        (
            lambda peer: _mm2_subscribe("news", filters=(Filter("k", Op.EQ, "v"),)),
            "not allowed to subscribe to 'news'",
        ),
    ],
    ids=["publish", "unicast", "subscribe", "queue-group", "filtered"],
)
def test_mm2_sends_an_error_frame_and_closes(connect, request_frame, text):
    bob = connect("mm2", "bob")
    bob._write(request_frame(bob))
    with pytest.raises(Closed, match=f"ERROR frame: {text}"):
        bob._barrier()
    bob.wait_closed()


def _mm2_subscribe(topic: str, **how) -> bytes:
    return mm2.encode_frame(mm2.encode_pubsub(Subscribe(topic, **how)))


def test_mm2_queue_groups_and_filters_where_allowed(connect):
    bob = connect("mm2", "bob")  # bob may read chat/
    for frame in (
        _mm2_subscribe("chat/q", queue="workers"),
        _mm2_subscribe("chat/f", filters=(Filter("k", Op.EQ, "v"),)),
    ):
        bob._write(frame)
        bob._barrier()  # no ERROR frame, no close
    alice = connect("ssmp", "alice")
    alice.publish("chat/q", b"to the group")
    alice.publish("chat/f", b"no property k: filtered out")
    assert bob.sync() == [Event("", "mcast", "chat/q", b"to the group")]


def test_sbus_disconnects_on_a_refusal(connect):
    reader = connect("sbus")
    reader.subscribe("chat/")  # contained in chat/, which it may read
    reader.subscribe("chat/room*/")
    alice = connect("ssmp", "alice")
    alice.publish("chat/room1/x", b"hello sbus")
    # once, though both patterns match it
    assert reader.sync() == [Event(UNKNOWN, "mcast", "chat/room1/x", b"hello sbus")]
    reader.publish("sensors/t", b"22")  # may write sensors/
    greedy = connect("sbus")
    greedy.send(b"SUB ")  # the empty pattern: everything, more than chat/
    greedy.wait_closed()
    writer = connect("sbus")
    writer.send(b"MSG chat/x\0no")  # may read chat/, not write it
    writer.wait_closed()


# -- whose rules ---------------------------------------------------------------------------------


def test_default_deny_for_someone_without_rules(connect):
    carol = connect("ssmp", "carol")
    for request in (
        lambda: carol.publish("chat/x", b"no"),
        lambda: carol.subscribe("chat/x"),
        lambda: carol.unicast("alice", b"no"),
        lambda: carol.broadcast(b"no"),
    ):
        with pytest.raises(Refused):
            request()
    carol.publish("users/carol/inbox", b"her own corner")
    with pytest.raises(Refused):
        carol.publish("users/alice/inbox", b"not hers")


def test_the_anonymous_identity_has_no_rules(connect):
    anonymous = connect("ssmp", ".")
    with pytest.raises(Refused):
        anonymous.publish("chat/x", b"no")
    with pytest.raises(Refused):
        anonymous.publish("users/./x", b"patterns with %u are not the anonymous identity's")


def _tls_context(pki, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def test_certificate_names_have_their_rules(broker, pki):
    device = pki.client("device-17", dns=("device-17.example.com",), filename="device-17")
    host, port = address(broker, "ssmp", tls=True).split(":")[1:]
    port = int(port)
    # whatever identity it logs in with, the certificate proves the name
    with BlockingSSMPClient(
        host, port, "dev", "open", ssl_context=_tls_context(pki, device)
    ) as dev:
        dev.mcast("sensors/17/temperature", b"21.5")
        with pytest.raises(SSMPError) as refused:
            dev.mcast("sensors/18/temperature", b"no")
        assert refused.value.code == 405
    with BlockingSSMPClient(
        host, port, "device-17/a", "cert", ssl_context=_tls_context(pki, device)
    ) as by_cert:
        by_cert.mcast("sensors/17/humidity", b"40")
    # the same identity without the certificate has no such rule
    with BlockingSSMPClient(host, port, "dev", "open", ssl_context=_tls_context(pki)) as plain:
        with pytest.raises(SSMPError) as refused:
            plain.mcast("sensors/17/temperature", b"no")
        assert refused.value.code == 405


# -- across protocols ----------------------------------------------------------------------------


def test_rules_hold_across_protocols(connect):
    bob_ssmp = connect("ssmp", "bob")
    bob_ssmp.subscribe("chat/lobby")
    mm2_bob = connect("mm2", "bob-mm2")  # no rules but its own corner: a refused publish
    alice_stmp = connect("stmp", "alice")
    alice_stmp.publish("chat/lobby", b"from stmp")
    assert bob_ssmp.sync() == [Event("alice", "mcast", "chat/lobby", b"from stmp")]
    mm2_bob._write(mm2_bob._message("chat/lobby", b"refused"))
    with pytest.raises(Closed, match="not allowed to publish"):
        mm2_bob._barrier()
    assert bob_ssmp.sync() == []  # nothing of the refused publish reached anyone
    sbus_reader = connect("sbus")
    sbus_reader.subscribe("chat/")
    alice_ws = connect("stmp-ws", "alice")
    alice_ws.publish("chat/lobby", b"from the web")
    assert bob_ssmp.sync() == [Event("alice", "mcast", "chat/lobby", b"from the web")]
    assert sbus_reader.sync() == [Event(UNKNOWN, "mcast", "chat/lobby", b"from the web")]


# -- reload on a running broker -------------------------------------------------------------------


def test_reload_on_a_running_broker(tmp_path):
    first = tmp_path / "first"
    first.write_text("user alice\ntopic write news/\npattern unicast %u\n")
    second = tmp_path / "second"
    second.write_text("user alice\ntopic write sport/\npattern unicast %u\n")
    bad = tmp_path / "bad"
    bad.write_text("user alice\ntopic write sport/\ntopic nope*nope\n")

    def config(path: Path) -> BrokerConfig:
        return BrokerConfig(
            listeners=(Listener.parse("ssmp=tcp:0:interface=127.0.0.1"),),
            auth=("open",),
            sections={"acl": {"file": str(path)}},
        )

    with running_broker(auth=("open",), sections={"acl": {"file": str(first)}}) as running:
        alice = SSMPPeer(f"tcp:{running.host}:{running.port}")
        alice.login("alice")
        alice.publish("news/a", b"allowed")
        with pytest.raises(ConfigError, match="line 3: the pattern 'nope\\*nope'"):
            running.call(running.service.broker.reload, config(bad))
        alice.publish("news/a", b"still allowed: the old rules stay")
        running.call(running.service.broker.reload, config(second))
        with pytest.raises(Refused):
            alice.publish("news/a", b"no longer")
        alice.publish("sport/a", b"the same connection, the new rules")
        alice.close()
