"""The sbus server over real unix seqpacket sockets, with raw clients written from the sbus
README: SUB/UNSUB/MSG/CMSG as docs/sbus.md ("Decisions") fixes them, credentials, echo, bad
input, and the socket file."""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Iterator

import pytest

from tests.sbus.server_support import Bus, running_bus
from tests.ssmp.e2e_support import WAIT


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with running_bus() as bus:
        yield bus


def me() -> bytes:
    return b"%d/%d/%d" % (os.getgid(), os.getuid(), os.getpid())


def test_socket_file_is_private_by_default(bus):
    mode = os.stat(bus.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o700


def test_a_message_reaches_the_matching_patterns_only(bus):
    star, prefix, exact, other, publisher = (bus.client() for _ in range(5))
    star.send(b"SUB m1/*/c")
    prefix.send(b"SUB m1/b/")
    exact.send(b"SUB m1/b/c")
    other.send(b"SUB m1/x")
    for c in (star, prefix, exact, other):
        c.sync()
    publisher.send(b"MSG m1/b/c\0one")
    publisher.send(b"MSG m1/b/c/d\0two")
    star.expect(b"MSG m1/b/c\0one")
    exact.expect(b"MSG m1/b/c\0one")
    prefix.expect(b"MSG m1/b/c\0one", b"MSG m1/b/c/d\0two")
    publisher.sync()
    assert star.sync() == [] and exact.sync() == [] and other.sync() == []


def test_empty_pattern_receives_other_keys_in_order(bus):
    everything, publisher = bus.client(), bus.client()
    everything.send(b"SUB ")
    everything.sync()
    publisher.send(b"MSG m3/a\0first")
    publisher.send(b"MSG \0empty key")
    seen = []
    while len(seen) < 2:
        packet = everything.recv()
        if packet in (b"MSG m3/a\0first", b"MSG \0empty key"):
            seen.append(packet)
    assert seen == [b"MSG m3/a\0first", b"MSG \0empty key"]


def test_payload_bytes_arrive_unchanged(bus):
    subscriber, publisher = bus.client(), bus.client()
    subscriber.send(b"SUB m4")
    subscriber.sync()
    payload = bytes(range(256)) * 4 + b"\0\0MSG x\0"
    publisher.send(b"MSG m4\0" + payload)
    subscriber.expect(b"MSG m4\0" + payload)


def test_a_duplicate_subscription_is_delivered_once_and_unsubscribed_one_copy_at_a_time(bus):
    subscriber, publisher = bus.client(), bus.client()
    subscriber.send(b"SUB m5")
    subscriber.send(b"SUB m5")
    subscriber.sync()
    publisher.send(b"MSG m5\0once")
    subscriber.expect(b"MSG m5\0once")
    publisher.sync()
    assert subscriber.sync() == []
    subscriber.send(b"UNSUB m5")
    subscriber.sync()
    publisher.send(b"MSG m5\0still")
    subscriber.expect(b"MSG m5\0still")
    subscriber.send(b"UNSUB m5")
    subscriber.sync()
    publisher.send(b"MSG m5\0gone")
    publisher.sync()
    assert subscriber.sync() == []


def test_unsubscribing_an_unknown_pattern_is_ignored(bus):
    c = bus.client()
    c.send(b"UNSUB never/subscribed")
    c.send(b"UNSUB m6\0ignored tail")
    assert c.sync() == []  # still connected and served


def test_what_follows_a_nul_in_sub_is_ignored(bus):
    subscriber, publisher = bus.client(), bus.client()
    subscriber.send(b"SUB m7\0whatever/*")
    subscriber.sync()
    publisher.send(b"MSG m7\0hit")
    publisher.send(b"MSG m7/x\0miss")
    subscriber.expect(b"MSG m7\0hit")
    publisher.sync()
    assert subscriber.sync() == []


def test_a_subscribed_publisher_gets_its_own_message_unless_echo_is_off(bus):
    c = bus.client()
    c.send(b"SUB m8")
    c.send(b"MSG m8\0echoed")
    c.expect(b"MSG m8\0echoed")
    c.send(b"CMSG echo/off")
    c.send(b"MSG m8\0not echoed")
    assert c.sync() == []
    c.send(b"CMSG echo/on\0")
    c.send(b"MSG m8\0echoed again")
    c.expect(b"MSG m8\0echoed again")


def test_whoami_answers_the_clients_credentials(bus):
    c = bus.client()
    c.send(b"CMSG !/cred/whoami")
    c.expect(b"CMSG !/cred/whoami\0!/cred/" + me())
    c.send(b"CMSG !/cred/whoami\0")
    c.expect(b"CMSG !/cred/whoami\0!/cred/" + me())


def test_control_messages_are_never_forwarded(bus):
    everything, sender = bus.client(), bus.client()
    everything.send(b"SUB ")
    everything.sync()
    sender.send(b"CMSG m9/custom\0secret sauce")
    sender.send(b"CMSG blocking/soft/queue")
    sender.sync()
    assert not any(p.startswith(b"CMSG") for p in everything.sync())


def test_a_secret_subscription_with_ones_own_credentials_gets_secret_messages(bus):
    mine, filled, publisher = bus.client(), bus.client(), bus.client()
    mine.send(b"SUB !/cred/" + me() + b"/m10")
    filled.send(b"SUB !/cred////m10")  # empty fields are the client's own
    mine.sync()
    filled.sync()
    publisher.send(b"MSG !/cred/" + me() + b"/m10\0for me")
    mine.expect(b"MSG !/cred/" + me() + b"/m10\0for me")
    filled.expect(b"MSG !/cred/" + me() + b"/m10\0for me")


def test_secret_messages_never_reach_patterns_without_those_credentials(bus):
    empty, star, wild, publisher = bus.client(), bus.client(), bus.client(), bus.client()
    empty.send(b"SUB ")
    star.send(b"SUB */*/*/*/*/*")
    wild.send(b"SUB !/*/")
    for c in (empty, star, wild):
        c.sync()
    publisher.send(b"MSG !/cred/" + me() + b"/m11\0private")
    publisher.sync()
    for c in (empty, star, wild):
        assert not any(b"private" in p for p in c.sync())


@pytest.mark.parametrize(
    "pattern",
    [
        b"!/cred/0/0/1/x",  # another pid (ours is never 1)
        b"!/cred/*/*/*/x",  # no wildcards in the fields
        b"!/cred/1/2",  # truncated
        b"!/cred/" + b"0%d" % os.getgid() + b"//x",  # not as the server writes it
    ],
)
def test_subscribing_to_someone_elses_secret_disconnects(bus, pattern):
    bad, bystander = bus.client(), bus.client()
    bad.send(b"SUB " + pattern)
    assert bad.closed_by_server()
    assert bystander.sync() == []


@pytest.mark.parametrize(
    "packet",
    [
        b"",  # empty
        b"FOO x",  # unknown verb
        b"SUB",  # no space, no pattern
        b"MSG",
        b"MSG key without nul",
        b"sub lower/case",
        b"SUB\tx",
    ],
    ids=["empty", "unknown", "SUB", "MSG", "MSG-no-NUL", "lowercase", "tab"],
)
def test_bad_packets_close_that_client_only(bus, packet):
    bystander, bad = bus.client(), bus.client()
    bystander.send(b"SUB m12")
    bystander.sync()
    bad.send(b"SUB m12")
    bad.sync()
    bad.send(packet)
    assert bad.closed_by_server()
    bystander.send(b"MSG m12\0still here")
    bystander.expect(b"MSG m12\0still here")


def test_a_packet_over_the_configured_maximum_closes_that_client_only():
    with running_bus(":max-packet=1024") as small:
        bystander, bad = small.client(), small.client()
        bystander.send(b"SUB m18")
        bystander.sync()
        bad.send(b"MSG m18\0" + b"x" * (1024 - len(b"MSG m18\0")))  # exactly the maximum
        bystander.expect(b"MSG m18\0" + b"x" * (1024 - len(b"MSG m18\0")))
        bad.send(b"MSG m18\0" + b"x" * (1025 - len(b"MSG m18\0")))
        assert bad.closed_by_server()
        bystander.send(b"MSG m18\0still here")
        bystander.expect(b"MSG m18\0still here")


def test_the_largest_allowed_packet_is_delivered(bus):
    subscriber, publisher = bus.client(), bus.client()
    subscriber.send(b"SUB m13")
    subscriber.sync()
    packet = b"MSG m13\0" + b"p" * (212_960 - len(b"MSG m13\0"))
    publisher.send(packet)
    subscriber.expect(packet)


def test_packets_sent_just_before_closing_are_delivered(bus):
    subscriber = bus.client()
    subscriber.send(b"SUB m14")
    subscriber.sync()
    publisher = bus.client()
    for i in range(200):
        publisher.send(b"MSG m14\0%d" % i)
    publisher.close()
    for i in range(200):
        subscriber.expect(b"MSG m14\0%d" % i)


def test_cross_protocol_both_ways_with_the_sbus_identity(bus):
    sock, reader = bus.ssmp("m15-ssmp")
    sock.sendall(b"SUBSCRIBE m15/t\n")
    assert reader.readline() == b"200\n"
    sbus = bus.client()
    sbus.send(b"SUB m15/*")
    sbus.sync()
    sbus.send(b"MSG m15/t\0from sbus")
    expected = b"000 sbus:%d:%d MCAST m15/t from sbus\n" % (os.getuid(), os.getpid())
    assert reader.readline() == expected
    assert sbus.recv() == b"MSG m15/t\0from sbus"  # echo: it subscribes to m15/*
    sock.sendall(b"MCAST m15/u from-ssmp\n")
    assert reader.readline() == b"200\n"
    sbus.expect(b"MSG m15/u\0from-ssmp")
    sock.close()


def test_an_ssmp_recipient_that_cannot_carry_a_message_is_skipped(bus):
    sock, reader = bus.ssmp("m16-ssmp")
    sock.sendall(b"SUBSCRIBE m16\n")
    assert reader.readline() == b"200\n"
    sbus = bus.client()
    sbus.send(b"SUB m16")
    sbus.sync()
    sbus.send(b"MSG m16\0" + b"L" * 2000)  # SSMP carries at most 1024 bytes
    sbus.send(b"MSG m16\0small")
    sbus.expect(b"MSG m16\0" + b"L" * 2000, b"MSG m16\0small")
    assert reader.readline().endswith(b"MCAST m16 small\n")
    sock.close()


def test_a_client_subscribed_to_many_patterns_is_forgotten_when_it_closes(bus):
    c = bus.client()
    for i in range(50):
        c.send(b"SUB m17/%d/*" % i)
    c.sync()
    gone = threading.Event()

    def watch() -> int:
        [session] = [
            s
            for s in bus.broker.service.broker.sessions
            if "m17/0/*" in bus.hub.patterns.patterns_of(s)
        ]
        session.on_lost.append(gone.set)
        return len(bus.hub.patterns)

    before = bus.broker.call(watch)
    c.close()
    assert gone.wait(WAIT)
    assert bus.broker.call(lambda: len(bus.hub.patterns)) == before - 50 - 0


def test_a_stale_socket_file_is_replaced_and_a_live_one_is_not(tmp_path):
    from msgbroker.plugins.sbus.seqpacket import SeqpacketAddress, bind

    path = str(tmp_path / "s")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens
    live = bind(SeqpacketAddress(path=path))
    try:
        with pytest.raises(OSError):
            bind(SeqpacketAddress(path=path))
    finally:
        live.close()
    regular = tmp_path / "file"
    regular.write_text("not a socket")
    with pytest.raises(OSError):
        bind(SeqpacketAddress(path=str(regular)))
    assert regular.read_text() == "not a socket"


def test_repeated_publishes_follow_every_change_of_recipients(bus):
    """A publisher's repeated key is routed from a cache of its recipients: every change
    (SUB, UNSUB, another protocol's subscriber, echo) must show at once."""
    publisher, first = bus.client(), bus.client()
    first.send(b"SUB m19")
    first.sync()
    publisher.send(b"MSG m19\0a")
    publisher.send(b"MSG m19\0b")
    first.expect(b"MSG m19\0a", b"MSG m19\0b")
    second = bus.client()
    second.send(b"SUB m1*")
    second.sync()
    publisher.send(b"MSG m19\0c")
    first.expect(b"MSG m19\0c")
    second.expect(b"MSG m19\0c")
    first.send(b"UNSUB m19")
    first.sync()
    publisher.send(b"MSG m19\0d")
    second.expect(b"MSG m19\0d")
    sock, reader = bus.ssmp("m19-ssmp")
    sock.sendall(b"SUBSCRIBE m19\n")
    assert reader.readline() == b"200\n"
    publisher.send(b"MSG m19\0e")
    second.expect(b"MSG m19\0e")
    assert reader.readline().endswith(b" MCAST m19 e\n")
    publisher.send(b"SUB m19")
    publisher.send(b"MSG m19\0f")
    publisher.expect(b"MSG m19\0f")  # echo
    publisher.send(b"CMSG echo/off")
    publisher.send(b"MSG m19\0g")
    second.expect(b"MSG m19\0f", b"MSG m19\0g")
    assert publisher.sync() == [] and first.sync() == []
    sock.close()
