"""``block`` flood control is bounded (plugins/sbus/flood.py): a slow client may pause the
publishers feeding it for at most ``block_timeout`` seconds per stall; then its fallback
applies at once — ``error`` disconnects it, ``discard`` lets the publishers go and drops
what would have paused them until its backlog is empty. Real seqpacket socket pairs, time
from a Clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from twisted.internet.task import Clock

from msgbroker.plugins.sbus.flood import Throttle
from tests.sbus.test_flood import Pair, drain_through

TIMEOUT = 1.0


class Publisher:
    """A publisher's throttle that records when it is paused and resumed."""

    def __init__(self, name: str = "") -> None:
        self.events: list[str] = []
        self.throttle = Throttle(
            lambda: self.events.append("pause" + name), lambda: self.events.append("resume" + name)
        )


@pytest.fixture
def bounded() -> Iterator[object]:
    made: list[Pair] = []

    def make(fallback: str = "error", **policy: object) -> tuple[Pair, Clock, list[int]]:
        clock = Clock()
        p = Pair(**policy)  # type: ignore[arg-type]
        made.append(p)
        dropped: list[int] = []
        p.outbox.block_timeout = TIMEOUT
        p.outbox.call_later = clock.callLater
        p.outbox.fallback = fallback
        if "hard" not in policy:  # as the server sets it: the broker's policy by default
            p.outbox.policy.hard = fallback
        p.outbox.on_dropped = dropped.append
        return p, clock, dropped

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize(("soft", "hard"), [("block", "error"), ("block", "block")])
def test_a_stall_outlasting_the_timeout_disconnects_the_client_and_resumes_at_once(
    bounded, soft, hard
):
    p, clock, _ = bounded(fallback="error", soft=soft, hard=hard)
    publisher = Publisher()
    p.source = publisher.throttle
    p.fill()
    assert publisher.events == ["pause"]
    clock.advance(TIMEOUT - 0.001)
    assert p.errors == [] and publisher.events == ["pause"]
    clock.advance(0.001)
    assert p.errors == ["paused its publishers for 1 s (blocking/*/block)"]
    assert publisher.events == ["pause", "resume"] and p.outbox.closed


def test_hard_block_is_bounded_too(bounded):
    p, clock, _ = bounded(fallback="error", max_bytes=300, hard="block")
    publisher = Publisher()
    p.source = publisher.throttle
    p.fill()
    p.outbox.offer(b"y" * 300)  # past the bound: kept, publisher paused
    assert publisher.events == ["pause"]
    clock.advance(TIMEOUT)
    assert p.errors and publisher.events == ["pause", "resume"]


def test_with_the_discard_fallback_the_client_stays_and_what_would_pause_is_dropped(bounded):
    p, clock, dropped = bounded(fallback="discard", soft="block", hard="block")
    publisher = Publisher()
    p.source = publisher.throttle
    sent = p.fill()  # the first refused packet is kept, the publisher paused
    p.outbox.offer(b"kept while paused")
    clock.advance(TIMEOUT)
    assert p.errors == [] and not p.outbox.closed
    assert publisher.events == ["pause", "resume"]
    # for the rest of this stall nothing pauses anyone: what cannot be sent is dropped
    p.outbox.offer(b"dropped 1")
    p.outbox.offer(b"dropped 2")
    assert publisher.events == ["pause", "resume"]
    assert p.outbox.dropped == 2 and dropped == [1, 1]
    # what was kept before the timeout still arrives, in order
    got = drain_through(p)
    assert got[sent:] == [b"sent %06d" % sent, b"kept while paused"]


def test_the_clients_own_hard_discard_wins_over_the_brokers_fallback(bounded):
    p, clock, dropped = bounded(fallback="error", soft="block", hard="discard")
    publisher = Publisher()
    p.source = publisher.throttle
    p.fill()
    clock.advance(TIMEOUT)
    assert p.errors == [] and publisher.events == ["pause", "resume"]
    p.outbox.offer(b"dropped")
    assert dropped == [1]


def test_a_stall_that_drains_in_time_is_no_stall_and_the_next_one_has_its_full_time(bounded):
    p, clock, _ = bounded(fallback="discard", soft="block")
    publisher = Publisher()
    p.source = publisher.throttle
    p.fill()
    clock.advance(TIMEOUT - 0.1)
    drain_through(p)
    assert publisher.events == ["pause", "resume"]
    assert clock.getDelayedCalls() == []  # the deadline went with the stall
    # a new stall: paused again, for a full timeout from now
    p.fill()
    assert publisher.events == ["pause", "resume", "pause"]
    clock.advance(TIMEOUT - 0.001)
    assert publisher.events == ["pause", "resume", "pause"]
    clock.advance(0.001)
    assert publisher.events == ["pause", "resume", "pause", "resume"]


def test_after_a_discarded_stall_drains_block_pauses_again(bounded):
    p, clock, _ = bounded(fallback="discard", soft="block")
    publisher = Publisher()
    p.source = publisher.throttle
    p.fill()
    clock.advance(TIMEOUT)
    p.outbox.offer(b"dropped")
    drain_through(p)
    p.fill()
    assert publisher.events == ["pause", "resume", "pause"]
    assert p.outbox.dropped == 1


def test_every_publisher_paused_in_one_stall_resumes_at_its_deadline(bounded):
    p, clock, _ = bounded(fallback="discard", soft="block")
    first, second = Publisher(" 1"), Publisher(" 2")
    p.source = first.throttle
    p.fill()
    clock.advance(TIMEOUT / 2)
    p.source = second.throttle
    p.outbox.offer(b"from 2")
    assert second.events == ["pause 2"]
    clock.advance(TIMEOUT / 2)  # one deadline per stall, from its start
    assert first.events == ["pause 1", "resume 1"] and second.events == ["pause 2", "resume 2"]


def test_closing_the_client_cancels_the_deadline(bounded):
    p, clock, _ = bounded(soft="block")
    p.source = Publisher().throttle
    p.fill()
    assert len(clock.getDelayedCalls()) == 1  # the stall's deadline
    p.outbox.close()
    assert clock.getDelayedCalls() == []
    assert p.errors == []


def test_without_a_timeout_block_waits_for_ever():
    p = Pair(soft="block")  # the clients' side: no block_timeout, no clock
    try:
        publisher = Publisher()
        p.source = publisher.throttle
        p.fill()
        assert publisher.events == ["pause"] and p.errors == []
        drain_through(p)
        assert publisher.events == ["pause", "resume"]
    finally:
        p.close()
