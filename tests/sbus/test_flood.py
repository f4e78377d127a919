"""Flood control (plugins/sbus/flood.py) on real seqpacket socket pairs: the client end is
filled until the kernel refuses more, then each policy decides what happens to the rest."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from msgbroker.plugins.sbus.flood import PACKET_OVERHEAD, FloodPolicy, Outbox, Throttle
from msgbroker.reasons import CloseReason


class Sockets:
    """A real seqpacket socket pair: the server end non-blocking with a small send buffer,
    the client end read only when told (:meth:`read_all`)."""

    def __init__(self) -> None:
        self.server, self.client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        self.server.setblocking(False)
        self.client.setblocking(False)

    def read_all(self) -> list[bytes]:
        packets = []
        while True:
            try:
                packets.append(self.client.recv(65536))
            except BlockingIOError:
                return packets

    def close(self) -> None:
        self.server.close()
        self.client.close()


class Pair(Sockets):
    """An outbox writing into a real seqpacket socket whose peer reads only when told."""

    def __init__(self, max_bytes: int = 1 << 20, **policy: str) -> None:
        super().__init__()
        self.writable: list[bool] = []
        #: why the outbox gave up, in its words, and as a close reason
        self.errors: list[str] = []
        self.reasons: list[CloseReason] = []
        self.source: Throttle | None = None
        self.outbox = Outbox(
            self.server.send,
            self.writable.append,
            self._error,
            max_bytes,
            lambda: self.source,
            FloodPolicy(**policy),
        )

    def _error(self, reason: CloseReason, detail: str) -> None:
        self.reasons.append(reason)
        self.errors.append(detail)

    def fill(self) -> int:
        """Offer packets until one is not sent at once; returns how many went out. The
        first packet that did not go out is ``b"full"``, and is left to the policy."""
        sent = 0
        while True:
            before = self.outbox.backlog, self.outbox.dropped, len(self.errors)
            self.outbox.offer(b"sent %06d" % sent)
            if (self.outbox.backlog, self.outbox.dropped, len(self.errors)) != before:
                return sent
            sent += 1


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    made: list[Pair] = []

    def make(**kwargs: object) -> Pair:
        p = Pair(**kwargs)  # type: ignore[arg-type]
        made.append(p)
        return p

    yield make  # type: ignore[misc]
    for p in made:
        p.close()


def drain_through(p: Pair) -> list[bytes]:
    """Read and let the outbox send until nothing is left; everything the client got."""
    got: list[bytes] = []
    while True:
        got += p.read_all()
        if not p.outbox.backlog:
            return got + p.read_all()
        p.outbox.drain()


def test_sends_at_once_while_the_socket_takes_it(pair):
    p = pair()
    p.outbox.offer(b"MSG a\0one")
    p.outbox.offer(b"MSG a\0two")
    assert p.read_all() == [b"MSG a\0one", b"MSG a\0two"]
    assert p.outbox.backlog == 0 and p.writable == []


def test_soft_queue_keeps_what_does_not_fit_and_sends_it_in_order(pair):
    p = pair()
    sent = p.fill()  # the first refused packet is kept
    for i in range(sent, sent + 5):
        p.outbox.offer(b"kept %06d" % i)
    assert p.writable == [True] and len(p.outbox) == 6
    got = drain_through(p)
    assert got == [b"sent %06d" % i for i in range(sent + 1)] + [
        b"kept %06d" % i for i in range(sent, sent + 5)
    ]
    assert p.writable[-1] is False and p.outbox.dropped == 0


def test_order_stack_sends_the_newest_first(pair):
    p = pair(order="stack")
    sent = p.fill()
    p.outbox.offer(b"second")
    p.outbox.offer(b"third")
    got = drain_through(p)
    assert got[:sent] == [b"sent %06d" % i for i in range(sent)]
    assert got[sent:] == [b"third", b"second", b"sent %06d" % sent]


def test_order_random_sends_the_largest_first(pair):
    p = pair(order="random")
    sent = p.fill()
    p.outbox.offer(b"m" * 50)
    p.outbox.offer(b"s")
    p.outbox.offer(b"L" * 500)
    p.outbox.offer(b"m" * 49 + b"2")
    got = drain_through(p)[sent:]
    assert got == [b"L" * 500, b"m" * 50, b"m" * 49 + b"2", b"sent %06d" % sent, b"s"]


def test_changing_the_order_rearranges_what_waits(pair):
    p = pair()
    sent = p.fill()
    p.outbox.offer(b"a" * 20)
    p.outbox.offer(b"b" * 30)
    p.outbox.policy.apply(b"order/random")
    p.outbox.reorder()
    p.outbox.offer(b"c" * 25)
    p.outbox.policy.apply(b"order/queue")
    p.outbox.reorder()  # back to arrival order, the late one included
    got = drain_through(p)[sent:]
    assert got == [b"sent %06d" % sent, b"a" * 20, b"b" * 30, b"c" * 25]


def test_soft_discard_drops_what_cannot_be_sent_now(pair):
    p = pair(soft="discard")
    sent = p.fill()
    p.outbox.offer(b"lost too")
    assert p.outbox.dropped == 2 and p.outbox.backlog == 0 and p.writable == []
    assert p.read_all() == [b"sent %06d" % i for i in range(sent)]


def test_soft_error_disconnects_at_the_first_packet_that_would_block(pair):
    p = pair(soft="error")
    p.fill()
    assert p.errors == ["could not take a message (blocking/soft/error)"]
    assert p.reasons == [CloseReason.FLOOD_CONTROL]  # the client's own choice
    assert p.outbox.closed
    p.outbox.offer(b"after")  # ignored once closed
    assert p.outbox.backlog == 0


@pytest.mark.parametrize("soft", ["queue", "block"])
def test_hard_discard_keeps_the_backlog_within_its_bound(pair, soft):
    p = pair(max_bytes=1000, soft=soft, hard="discard")
    p.fill()
    for _ in range(100):
        p.outbox.offer(b"x" * 100)
    assert p.outbox.backlog <= 1000
    kept = (1000 - len(b"sent 000000") - PACKET_OVERHEAD) // (100 + PACKET_OVERHEAD)
    assert p.outbox.dropped == 100 - kept
    assert p.errors == []


def test_hard_error_disconnects_when_the_bound_is_passed(pair):
    p = pair(max_bytes=400, hard="error")
    p.fill()
    p.outbox.offer(b"x" * 200)
    assert p.errors == []
    p.outbox.offer(b"x" * 200)
    assert p.errors == ["backlog over its bound (blocking/hard/error)"] and p.outbox.closed
    assert p.reasons == [CloseReason.SLOW_CONSUMER]


def test_hard_block_pauses_the_publisher_past_the_bound_and_releases_it_when_drained(pair):
    p = pair(max_bytes=300, hard="block")
    events: list[str] = []
    p.source = Throttle(lambda: events.append("pause"), lambda: events.append("resume"))
    sent = p.fill()
    p.outbox.offer(b"x" * 100)  # within the bound: kept, publisher not paused
    assert events == []
    p.outbox.offer(b"y" * 300)  # past it: kept anyway, publisher paused
    assert events == ["pause"] and p.outbox.dropped == 0
    got = drain_through(p)
    assert events == ["pause", "resume"]
    assert got[sent:] == [b"sent %06d" % sent, b"x" * 100, b"y" * 300]


def test_soft_block_pauses_each_publisher_once_and_resumes_when_all_is_sent(pair):
    p = pair(soft="block")
    events: list[str] = []
    first = Throttle(lambda: events.append("pause 1"), lambda: events.append("resume 1"))
    second = Throttle(lambda: events.append("pause 2"), lambda: events.append("resume 2"))
    p.source = first
    p.fill()
    p.outbox.offer(b"again from 1")
    p.source = second
    p.outbox.offer(b"from 2")
    assert events == ["pause 1", "pause 2"]
    p.read_all()
    p.outbox.drain()  # may still leave some: resume only once everything is out
    drain_through(p)
    assert sorted(events[2:]) == ["resume 1", "resume 2"]


def test_a_publisher_paused_by_two_clients_resumes_when_both_have_drained(pair):
    a, b = pair(soft="block"), pair(soft="block")
    events: list[str] = []
    shared = Throttle(lambda: events.append("pause"), lambda: events.append("resume"))
    a.source = b.source = shared
    a.fill()
    b.fill()
    assert events == ["pause"]
    drain_through(a)
    assert events == ["pause"] and shared.held
    drain_through(b)
    assert events == ["pause", "resume"] and not shared.held


def test_closing_drops_the_backlog_and_releases_the_publishers(pair):
    p = pair(soft="block")
    events: list[str] = []
    p.source = Throttle(lambda: events.append("pause"), lambda: events.append("resume"))
    p.fill()
    p.outbox.close()
    assert events == ["pause", "resume"] and p.outbox.backlog == 0 and len(p.outbox) == 0


def test_a_reply_is_never_dropped_by_the_soft_policy(pair):
    p = pair(soft="discard")
    sent = p.fill()
    p.outbox.reply(b"CMSG !/cred/whoami\0!/cred/1/2/3")
    got = drain_through(p)
    assert got == [b"sent %06d" % i for i in range(sent)] + [b"CMSG !/cred/whoami\0!/cred/1/2/3"]


def test_a_client_that_went_away_closes_the_outbox_quietly(pair):
    p = pair()
    p.client.close()
    p.outbox.offer(b"MSG a\0to nobody")
    assert p.outbox.closed and p.errors == []


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [
        (b"blocking/soft/queue", "soft", "queue"),
        (b"blocking/soft/discard", "soft", "discard"),
        (b"blocking/soft/block", "soft", "block"),
        (b"blocking/soft/error", "soft", "error"),
        (b"blocking/hard/discard", "hard", "discard"),
        (b"blocking/hard/block", "hard", "block"),
        (b"blocking/hard/error", "hard", "error"),
        (b"order/queue", "order", "queue"),
        (b"order/stack", "order", "stack"),
        (b"order/random", "order", "random"),
    ],
)
def test_policy_takes_each_flood_control_message(key, field, value):
    policy = FloodPolicy(soft="block", hard="block", order="stack")
    if getattr(policy, field) == value:
        policy = FloodPolicy(soft="error", hard="discard", order="random")
    assert policy.apply(key)
    assert getattr(policy, field) == value


@pytest.mark.parametrize(
    "key", [b"blocking/soft/stack", b"blocking/hard/queue", b"order/block", b"echo/off", b""]
)
def test_policy_ignores_what_is_not_flood_control(key):
    policy = FloodPolicy()
    assert not policy.apply(key)
    assert policy == FloodPolicy()


def test_outboxes_share_the_brokers_output_budget_and_the_largest_is_cut_first():
    from msgbroker.output import OutputBudget

    budget = OutputBudget(5000)
    big, small = Pair(hard="error"), Pair(hard="error")
    try:
        for p in (big, small):
            p.outbox.budget = budget
            p.fill()
        for _ in range(20):
            big.outbox.offer(b"b" * 100)
        assert not big.errors
        held = big.outbox.backlog
        assert budget.total == big.outbox.backlog + small.outbox.backlog
        while not big.errors:  # the small one grows until the total passes the budget
            small.outbox.offer(b"s" * 100)
        assert big.errors == ["the broker's output budget is spent (--max-output)"]
        assert big.outbox.closed and not small.errors
        assert budget.total == small.outbox.backlog <= 5000
        assert held > small.outbox.backlog - 200  # it was the largest when cut
    finally:
        big.close()
        small.close()


def test_a_discarding_outbox_over_the_output_budget_drops_and_keeps_its_backlog():
    from msgbroker.output import OutputBudget

    budget = OutputBudget(1000)
    pair = Pair(hard="discard")
    try:
        pair.outbox.budget = budget
        pair.fill()
        while pair.outbox.dropped == 0:
            pair.outbox.offer(b"d" * 100)
        assert pair.outbox.backlog <= 1000 and not pair.errors
        pair.read_all()
        pair.outbox.drain()
        assert budget.total == 0 and not budget.members  # drained: it left the budget
    finally:
        pair.close()
