"""Floods: of subscriptions, of slow consumers, of connections and of logins. Each holds
its limit, keeps the broker's memory under a stated bound (and gives it back once the
attackers are gone), and never stops a healthy pair of clients."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.abuse.harness import (
    FIGURES,
    HealthyPair,
    mib,
    read_exactly,
    read_until,
    scale,
    ssmp_connect,
    wait_until,
)


def test_subscription_flood_stops_at_the_limits_and_memory_comes_back(start_broker):
    """One SSMP connection pipelining SUBSCRIBE topic-N got 1,001,500 topics (+917 MB) and
    kept 429 MB after it closed. Now each connection stops at max-subscriptions, the broker
    at max-topics, and the memory is returned."""
    per_connection = 10_000  # the defaults: 10,000 per connection, 100,000 topics
    connections = 11
    extra = scale(500, 100_000)  # requests past the limit, on each connection
    broker = start_broker()
    pair = HealthyPair(broker)
    pair.exchange(500)
    before = broker.rss()
    broker.reset_peak()

    accepted = refused = 0
    attackers = []
    for c in range(connections):
        sock = ssmp_connect(broker.tcp("ssmp"), b"flood%d" % c)
        attackers.append(sock)
        total = per_connection + extra
        sender = threading.Thread(
            target=sock.sendall,
            args=(b"".join(b"SUBSCRIBE t%d-%d\n" % (c, i) for i in range(total)),),
        )
        sender.start()
        replies = read_exactly(sock, 4 * total)
        sender.join()
        accepted += replies.count(b"200\n")
        refused += replies.count(b"405\n")
        assert replies.count(b"200\n") <= per_connection
    rate = pair.exchange(2000)  # the healthy pair, with 100,000 topics in the broker
    assert accepted == 100_000 - 1  # the healthy pair's topic is one of the 100,000
    assert refused == connections * (per_connection + extra) - accepted
    for sock in attackers:  # every attacker is still connected, and still answered
        sock.sendall(b"PING\n")
        assert read_until(sock, b"000 . PONG\n").endswith(b"000 . PONG\n")
    status = broker.status()
    assert status["topics"] == 100_000
    assert status["refused"] == refused
    peak = broker.peak()

    for sock in attackers:
        sock.close()
    assert wait_until(lambda: broker.status()["topics"] == 1)
    # the topic table is rebuilt and the heap trimmed a second after the release
    # (about +14 MiB remains: what the allocator cannot hand back; +104 MiB at the peak)
    after = broker.trimmed_below(before + (24 << 20))
    assert peak - before < 400 << 20  # 100,000 topics and 10,000-subscription sessions
    FIGURES["subscription flood"] = {
        "attack": f"{connections} SSMP connections x {per_connection + extra} SUBSCRIBE",
        "accepted": accepted,
        "refused": refused,
        "rss_before_mib": mib(before),
        "rss_peak_mib": mib(peak),
        "rss_after_mib": mib(after),
        "healthy_pair_msgs_per_s_under_100k_topics": round(rate),
    }
    pair.close()
    broker.assert_no_traceback()


def stalled_subscriber(address, identity: bytes, topic: bytes) -> socket.socket:
    """An SSMP subscriber that never reads after subscribing, with a small receive buffer
    so the broker, not the kernel, holds what it is sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(address)
    sock.sendall(b"LOGIN %s open\nSUBSCRIBE %s\n" % (identity, topic))
    assert read_exactly(sock, 8) == b"200\n200\n"
    return sock


def test_slow_consumer_flood_is_held_by_the_global_output_budget(start_broker):
    """100 slow readers reached 1.6 GB (16 MiB each) and kept it after they were cut. Now
    all of them together hold at most max-output, the largest are cut first, and the
    memory comes back."""
    stalled_count = scale(30, 100)
    max_output = 64 << 20
    # each reader's own bound is out of reach: only the shared budget can cut them
    broker = start_broker("--max-output", str(max_output), "--max-backlog", "1G")
    pair = HealthyPair(broker)
    pair.exchange(500)
    idle_rate = pair.exchange(5000)
    before = broker.rss()
    broker.reset_peak()
    address = broker.tcp("ssmp")
    stalled = [stalled_subscriber(address, b"slow%d" % i, b"flood") for i in range(stalled_count)]
    publisher = ssmp_connect(address, b"flooder")
    payload = b"x" * 1000
    # 24 MB for each stalled reader: without the shared bound the broker would hold about
    # 20 MB of it for each (the kernel buffers the rest)
    count = 24_000
    sender = threading.Thread(
        target=lambda: [
            publisher.sendall(b"MCAST flood %s\n" % payload * 500) for _ in range(count // 500)
        ]
    )
    sender.start()
    rate = pair.exchange(5000)  # while the flood goes on
    assert read_exactly(publisher, 4 * count) == b"200\n" * count
    sender.join()
    status = broker.status()
    assert status["bytes_queued"] <= max_output
    peak = broker.peak()
    # the budget, and the 64 KiB Twisted keeps per connection before the budget counts
    assert peak - before < max_output + stalled_count * (64 << 10) + (96 << 20), mib(peak)
    cut = stalled_count + 3 - status["connections"]  # the pair and the publisher stay
    assert cut >= 1  # the largest backlogs were cut to stay within the budget
    for sock in stalled:
        sock.close()
    assert wait_until(lambda: broker.status()["connections"] == 3)  # the pair and publisher
    after = broker.trimmed_below(before + (16 << 20))
    FIGURES["slow-consumer flood"] = {
        "attack": f"{stalled_count} SSMP subscribers that never read, {count} x 1 KB MCASTs",
        "max_output_mib": mib(max_output),
        "cut": cut,
        "rss_before_mib": mib(before),
        "rss_peak_mib": mib(peak),
        "rss_after_mib": mib(after),
        "healthy_pair_msgs_per_s_idle": round(idle_rate),
        "healthy_pair_msgs_per_s_during": round(rate),
    }
    publisher.close()
    pair.close()
    broker.assert_no_traceback()


def test_connection_flood_over_the_per_address_limit(start_broker):
    """No connection limits: now per address and in all, refused before any login."""
    per_address = 50
    attempts = scale(300, 3000)
    broker = start_broker("--max-connections-per-address", str(per_address))
    pair = HealthyPair(broker)  # from 127.0.0.1
    address = broker.tcp("ssmp")
    flood = []
    for _ in range(attempts):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.bind(("127.0.0.2", 0))
        sock.connect(address)  # the kernel accepts; the broker closes what is over
        flood.append(sock)
    for i, sock in enumerate(flood):
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"LOGIN f%d open\n" % i)
    answered = 0
    for sock in flood:
        try:
            answer = sock.recv(4)
        except ConnectionResetError:
            answer = b""
        answered += answer == b"200\n"
    assert answered == per_address
    rate = pair.exchange(2000)
    other = ssmp_connect(address, b"elsewhere", source="127.0.0.3")  # another address
    status = broker.status()
    assert status["refused"] == attempts - per_address
    FIGURES["connection flood"] = {
        "attack": f"{attempts} connections from 127.0.0.2, limit {per_address} per address",
        "admitted": answered,
        "refused": status["refused"],
        "healthy_pair_msgs_per_s": round(rate),
    }
    for sock in flood:
        sock.close()
    other.close()
    pair.close()
    broker.assert_no_traceback()


def test_login_storm_is_throttled_per_address(start_broker, tmp_path):
    """4-5k wrong secrets a second per SSMP client: now failures from an address are
    limited (login-attempts), and once its bucket is empty even a right secret is refused
    unheard, while other addresses log in."""
    secret = tmp_path / "secret"
    secret.write_text("right\n")
    # the storm opens more connections from one address than the default allows
    broker = start_broker(
        *("--auth", "secret", "--secret-file", str(secret), "--login-attempts", "2"),
        *("--max-connections-per-address", "0"),
    )
    address = broker.tcp("ssmp")
    storm = scale(50, 2000)
    guesses = []
    for i in range(storm):
        sock = ssmp_connect(address, source="127.0.0.4")
        sock.sendall(b"LOGIN g%d secret wrong%d\n" % (i, i))
        guesses.append(sock)
    late = ssmp_connect(address, source="127.0.0.4")
    late.sendall(b"LOGIN late secret right\n")
    honest = ssmp_connect(address, source="127.0.0.5")
    honest.sendall(b"LOGIN honest secret right\n")
    assert read_exactly(honest, 4) == b"200\n"
    assert read_until(late, b"\n") == b"401 open secret\n"  # the right secret, unheard
    for sock in guesses:
        assert read_until(sock, b"\n") == b"401 open secret\n"
        sock.close()
    status = broker.status()
    assert status["refused"] >= storm + 1 - 2  # all but the bucket's two were unheard
    FIGURES["login storm"] = {
        "attack": f"{storm} wrong secrets from one address, login-attempts 2/s",
        "refused_unheard": status["refused"],
    }
    late.close()
    honest.close()
    broker.assert_no_traceback()
