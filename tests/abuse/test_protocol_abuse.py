"""Attacks through the protocols themselves: garbage on every listener, large frames and
endless WebSocket headers before login, an sbus client that blocks the bus, and names the
journal cannot encode. The broker answers each as its protocol says, holds its memory
bound, and other clients never notice."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading

import pytest

from tests.abuse.harness import (
    FIGURES,
    WAIT,
    BrokerProcess,
    HealthyPair,
    mib,
    read_exactly,
    scale,
    ssmp_connect,
    wait_until,
)
from tests.interop.mm2_peer import MM2Peer
from tests.interop.peers import SSMPPeer, STMPPeer, STMPWebSocketPeer
from tests.interop.sbus_peer import SbusPeer

ROUND_TRIP_PEERS = (SSMPPeer, STMPPeer, STMPWebSocketPeer, MM2Peer, SbusPeer)


def stream(broker: BrokerProcess, protocol: str) -> socket.socket:
    sock = socket.create_connection(broker.tcp(protocol), timeout=WAIT)
    return sock


def seqpacket(broker: BrokerProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(WAIT)
    sock.connect(broker.addresses["sbus"].removeprefix("unix:"))
    return sock


def every_protocol_still_works(broker: BrokerProcess) -> None:
    """A fresh client of each protocol subscribes, and an SSMP publisher reaches it."""
    publisher = SSMPPeer(broker.addresses["ssmp"])
    publisher.login("after-pub")
    for cls in ROUND_TRIP_PEERS:
        peer = cls(broker.addresses[cls.listener])
        if cls is not SbusPeer:
            peer.login(f"after-{cls.name}")
        peer.subscribe("after")
        publisher.publish("after", b"still here")
        event = peer.next_event()
        assert (event.kind, event.data) == ("mcast", b"still here"), cls.name
        peer.close()
    publisher.close()


def test_garbage_on_every_protocol_touches_no_one_else(start_broker):
    """1,000 garbage connections per protocol: each is closed (or ignored) as its protocol
    says, nothing is logged as a traceback, and clients of every protocol go on."""
    count = scale(100, 1000)
    rng = random.Random(12)
    broker = start_broker()
    pair = HealthyPair(broker)
    idle = pair.exchange(2000)
    before = broker.rss()
    broker.reset_peak()

    def garbage() -> bytes:
        return rng.randbytes(rng.randrange(1, 4096))

    def attack() -> None:
        for _ in range(count):
            for protocol in ("ssmp", "stmp", "stmp-ws", "mm2"):
                sock = stream(broker, protocol)
                with contextlib.suppress(OSError):  # closed by the broker: its answer
                    sock.sendall(garbage())
                sock.close()
            sock = seqpacket(broker)
            with contextlib.suppress(OSError):
                sock.send(garbage())
            sock.close()

    attacker = threading.Thread(target=attack)
    attacker.start()
    during = pair.exchange(5000)
    attacker.join()
    every_protocol_still_works(broker)
    assert wait_until(lambda: broker.status()["connections"] == 2)  # the pair
    peak = broker.peak()
    assert peak - before < 64 << 20, mib(peak - before)
    broker.assert_no_traceback()
    assert broker.alive()
    FIGURES["garbage"] = {
        "attack": f"{count} connections of random bytes on each of 5 listeners",
        "rss_before_mib": mib(before),
        "rss_peak_mib": mib(peak),
        "healthy_pair_msgs_per_s_idle": round(idle),
        "healthy_pair_msgs_per_s_during": round(during),
    }
    pair.close()


def stmp_large_request(size: int) -> bytes:
    """An STMP request (raw encoding) with a payload of ``size`` bytes, before any login."""
    header = bytes([0x40 | 5 << 3]) + struct.pack(">HI", 7, 0x00000104) + struct.pack(">I", size)
    return header + bytes(size)


def stmp_json_request(request_id: int, action: int, payload: bytes) -> bytes:
    """An STMP binary request with a JSON payload, as written on the wire."""
    head = bytes([1 << 6 | 2 << 3]) + struct.pack(">HI", request_id, action)
    return head + struct.pack(">I", len(payload)) + payload


def send_all_until_closed(sock: socket.socket, data: bytes) -> bool:
    """Send ``data``; True when the broker closed the connection before taking it all."""
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def read_to_end(sock: socket.socket) -> bytes:
    """What the broker sends until it closes the connection (a timeout fails the test)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_unauthenticated_large_frames_pin_no_memory(start_broker):
    """50 unauthenticated STMP connections sending 16 MiB payloads pinned +801 MB. Now a
    frame over prelogin-max-frame is refused as soon as its header is read."""
    connections = scale(10, 50)
    frame = stmp_large_request(16 << 20)
    broker = start_broker()
    pair = HealthyPair(broker)
    before = broker.rss()
    broker.reset_peak()
    attackers = [stream(broker, "stmp") for _ in range(connections)]
    cut = [False] * connections

    def send(i: int) -> None:
        cut[i] = send_all_until_closed(attackers[i], frame)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(connections)]
    for sender in senders:
        sender.start()
    rate = pair.exchange(2000)
    for sender in senders:
        sender.join()
    for sock in attackers:
        read_to_end(sock)  # closed by the broker, not by the login timeout
        sock.close()
    peak = broker.peak()
    assert peak - before < 32 << 20, mib(peak - before)
    assert all(cut)  # none of the 16 MiB went in
    FIGURES["unauthenticated large frames"] = {
        "attack": f"{connections} STMP connections each sending a 16 MiB request unlogged",
        "rss_before_mib": mib(before),
        "rss_peak_mib": mib(peak),
        "healthy_pair_msgs_per_s": round(rate),
    }
    pair.close()
    broker.assert_no_traceback()


def test_endless_websocket_headers_are_cut_at_the_cap(start_broker):
    """A WebSocket handshake with headers that never end: cut at prelogin-max-frame, and
    other clients' logins are not slowed by re-scanning them."""
    trickling = 20
    broker = start_broker("--login-timeout", "120")  # only the cap may end the handshake
    attackers = []
    for _ in range(trickling):
        sock = stream(broker, "stmp-ws")
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        attackers.append(sock)
    sent = [0] * trickling
    closed = [False] * trickling
    line = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    for _ in range(64):  # 64 KiB each, four times the cap
        for i, sock in enumerate(attackers):
            if closed[i]:
                continue
            try:
                sock.sendall(line)
                sent[i] += len(line)
            except (BrokenPipeError, ConnectionResetError):
                closed[i] = True
        pair_peer = STMPWebSocketPeer(broker.addresses["stmp-ws"])  # a healthy client
        pair_peer.login("healthy-ws")
        pair_peer.close()
    for sock in attackers:
        answer = read_to_end(sock)  # the broker closes it (a timeout fails the test)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
        sock.close()
    assert max(sent) <= (16 << 10) + 2 * len(line) + (256 << 10)  # cut near the cap
    broker.assert_no_traceback()


def test_an_sbus_client_that_blocks_everything_never_freezes_other_publishers(start_broker):
    """``SUB `` (every topic) plus ``CMSG blocking/soft/block``, never reading: an SSMP
    publisher froze within 1.4 s and lost messages. Now block pauses a publisher for at
    most block-timeout, then the blocker is cut."""
    broker = start_broker("--block-timeout", "0.5")
    blocker = seqpacket(broker)
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    blocker.send(b"SUB ")
    blocker.send(b"CMSG blocking/soft/block")
    blocker.send(b"CMSG blocking/hard/block")
    receiver = ssmp_connect(broker.tcp("ssmp"), b"receiver")
    receiver.sendall(b"SUBSCRIBE news\n")
    assert read_exactly(receiver, 4) == b"200\n"
    publisher = ssmp_connect(broker.tcp("ssmp"), b"publisher")
    count = scale(20_000, 200_000)
    payload = b"n" * 200
    sender = threading.Thread(
        target=lambda: [
            publisher.sendall(b"MCAST news %s\n" % payload * 1000) for _ in range(count // 1000)
        ]
    )
    sender.start()
    event = b"000 publisher MCAST news %s\n" % payload
    assert read_exactly(receiver, len(event) * count) == event * count  # nothing lost
    assert read_exactly(publisher, 4 * count) == b"200\n" * count
    sender.join()
    stmp = STMPPeer(broker.addresses["stmp"])  # an unrelated STMP publish goes through
    stmp.login("stmp-pub")
    stmp.publish("elsewhere", b"x")
    stmp.close()
    assert wait_until(lambda: broker.status()["connections"] == 2)  # the blocker was cut
    broker.assert_no_traceback()
    receiver.close()
    publisher.close()
    blocker.close()


@pytest.mark.parametrize("protocol", ["stmp", "sbus"])
def test_a_name_the_journal_cannot_encode_costs_no_other_record(start_broker, tmp_path, protocol):
    """One record with a lone surrogate (an sbus key ``k\\xff``, an STMP topic or login id
    ``x\\udcff``) made the writer drop its whole batch. Now every record is kept."""
    parquet = pytest.importorskip("pyarrow.parquet")
    journal = tmp_path / "journal"
    broker = start_broker("--journal", str(journal), "--journal-rotate-seconds", "0.2")
    good = ssmp_connect(broker.tcp("ssmp"), b"good")
    good.sendall(b"MCAST before hello\n")
    assert read_exactly(good, 4) == b"200\n"
    if protocol == "sbus":
        sock = seqpacket(broker)
        sock.send(b"MSG k\xff\0bad key")
        sock.close()
    else:
        # JSON may escape a lone surrogate ("\\udcff"); the broker's names are then no text
        bad_login = stream(broker, "stmp")
        bad_login.sendall(stmp_json_request(1, 0x101, rb'{"id": "x\udcff", "scheme": "nope"}'))
        assert bad_login.recv(4)[3] == 0x21  # Unauthorized, after the failure delay
        bad_login.close()
        publisher = stream(broker, "stmp")
        publisher.sendall(
            stmp_json_request(1, 0x101, rb'{"id": "stmp-good", "scheme": "open"}')
            + stmp_json_request(2, 0x104, rb'{"topic": "t\udcff", "data": "bad topic"}')
        )
        assert read_exactly(publisher, 8) == b"\xc0\x00\x01\x00\xc0\x00\x02\x00"
        publisher.close()
    good.sendall(b"MCAST after hello\n")
    assert read_exactly(good, 4) == b"200\n"
    good.close()

    def column(table: str, name: str) -> set[str]:
        found: set[str] = set()
        for path in journal.rglob("*.parquet"):
            if table in path.parts:
                values = parquet.read_table(path).column(name).to_pylist()
                found.update(v for v in values if v)
        return found

    # each look at the files follows a round trip to the broker (its status line)
    assert wait_until(
        lambda: bool(broker.status()) and {"before", "after"} <= column("messages", "topic")
    )
    assert wait_until(lambda: bool(broker.status()) and "good" in column("sessions", "identity"))
    assert not [line for line in broker.log.lines if "lost" in line]
    broker.assert_no_traceback()
