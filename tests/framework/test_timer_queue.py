"""One timer queue for every connection: the broker runs all sessions' timers (login
timeout, keepalive, a protocol's own) on one reactor call, and each still fires at its own
time (msgbroker.timers.TimerQueue)."""

from __future__ import annotations

from twisted.internet.task import Clock

from msgbroker.config import BrokerConfig
from msgbroker.reasons import CloseReason
from msgbroker.testing import connect, make_broker
from msgbroker.timers import Keepalive, TimerQueue, Timers


def test_login_timeouts_fire_each_at_its_own_time_on_one_reactor_call() -> None:
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=10))
    clock = broker.reactor
    early = [connect(broker, "ssmp", port=40000 + i) for i in range(3)]
    clock.advance(4)
    late = [connect(broker, "ssmp", port=41000 + i) for i in range(3)]
    assert len(clock.getDelayedCalls()) == 1  # one for all six, not one each
    clock.advance(5.75)  # (binary fractions: the clock's sums stay exact)
    assert not any(c.closed for c in early + late)
    clock.advance(0.25)  # 10 s after the first three opened
    assert all(c.closed for c in early)
    assert not any(c.closed for c in late)
    assert all(c.session.close_reason is CloseReason.LOGIN_TIMEOUT for c in early)
    clock.advance(3.75)
    assert not any(c.closed for c in late)
    clock.advance(0.25)
    assert all(c.closed for c in late)
    assert clock.getDelayedCalls() == []  # nothing pending: no reactor call left behind


def test_a_login_stops_its_own_timer_only() -> None:
    broker = make_broker(BrokerConfig(auth=("open",), login_timeout=10, keepalive=100))
    clock = broker.reactor
    alice, bob = connect(broker, "ssmp", port=40001), connect(broker, "ssmp", port=40002)
    alice.send(b"LOGIN alice open\n")
    assert alice.received() == b"200\n"
    clock.advance(10)
    assert not alice.closed
    assert bob.closed and bob.session.close_reason is CloseReason.LOGIN_TIMEOUT


def test_keepalives_ping_and_expire_each_connection_on_its_own_clock() -> None:
    broker = make_broker(BrokerConfig(auth=("open",), keepalive=30))
    clock = broker.reactor
    quiet = connect(broker, "ssmp", port=40001)
    quiet.send(b"LOGIN quiet open\n")
    clock.advance(10)
    chatty = connect(broker, "ssmp", port=40002)
    chatty.send(b"LOGIN chatty open\n")
    assert quiet.received() == chatty.received() == b"200\n"
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(20)  # quiet: idle for 30 s, pinged; chatty: 20 s
    assert quiet.received() == b"000 . PING\n"
    assert chatty.received() == b""
    chatty.send(b"PING\n")  # activity: its idle time starts again
    assert chatty.received() == b"000 . PONG\n"
    clock.advance(29.75)
    assert not quiet.closed and chatty.received() == b""
    clock.advance(0.25)  # quiet: 30 s after its ping, nothing came back
    assert quiet.closed and quiet.session.close_reason is CloseReason.KEEPALIVE_TIMEOUT
    assert not chatty.closed
    assert chatty.received() == b"000 . PING\n"  # 30 s after its own PING
    chatty.send(b"PONG\n")
    clock.advance(30)
    assert not chatty.closed
    chatty.drop()
    assert clock.getDelayedCalls() == []


def test_calls_run_in_deadline_order_and_those_asked_during_a_tick_wait_for_the_next() -> None:
    clock = Clock()
    queue = TimerQueue(clock.seconds)  # ticked by hand
    a, b = Timers(clock.seconds, queue), Timers(clock.seconds, queue)
    ran: list[str] = []

    def first() -> None:
        ran.append("a2")
        a.call_later(0, lambda: ran.append("a-again"))

    a.call_later(2, first)
    b.call_later(1, lambda: ran.append("b1"))
    a.call_later(1, lambda: ran.append("a1"))  # same deadline as b1, asked later
    clock.advance(2)
    queue.tick()
    assert ran == ["b1", "a1", "a2"]
    assert queue.deadline == 2
    queue.tick()
    assert ran == ["b1", "a1", "a2", "a-again"]


def test_cancelled_timers_never_run_and_are_let_go() -> None:
    clock = Clock()
    queue = TimerQueue(clock.seconds)
    queue.run_on(clock)
    timers = Timers(clock.seconds, queue)
    ran: list[int] = []
    kept = [timers.call_later(5 + i, lambda i=i: ran.append(i)) for i in range(200)]
    for timer in kept[:150]:
        timer.cancel()
        assert not timer.active and timer.call is None  # its callable goes at once
    assert len(queue) == 50 == len(timers.pending)
    assert len(queue._heap) < 200  # rebuilt once the cancelled were most of it
    clock.advance(300)
    assert ran == list(range(150, 200))
    timers.call_later(1, lambda: ran.append(-1)).cancel()
    assert clock.getDelayedCalls() == []  # the last pending one cancelled: no wake-up left


def test_cancel_all_ends_a_sessions_timers_and_not_the_others() -> None:
    clock = Clock()
    queue = TimerQueue(clock.seconds)
    queue.run_on(clock)
    gone, stays = Timers(clock.seconds, queue), Timers(clock.seconds, queue)
    ran: list[str] = []
    gone.call_later(1, lambda: ran.append("gone"))
    stays.call_later(2, lambda: ran.append("stays"))
    gone.cancel_all()
    assert gone.deadline is None and stays.deadline == 2
    clock.advance(2)
    assert ran == ["stays"]


class Owner:
    def __init__(self) -> None:
        self.pings: list[float] = []
        self.expired: list[float] = []
        self.keepalive_held = False
        self.clock = Clock()

    def send_keepalive(self) -> None:
        self.pings.append(self.clock.seconds())

    def keepalive_expired(self) -> None:
        self.expired.append(self.clock.seconds())


def test_keepalive_counts_a_held_peer_as_active() -> None:
    owner = Owner()
    timers = Timers(owner.clock.seconds)
    keepalive = Keepalive(timers, 10, owner)
    owner.keepalive_held = True  # the broker stopped reading: the silence is ours
    for _ in range(5):
        owner.clock.advance(10)
        timers.tick()
    assert owner.pings == [] and owner.expired == []
    owner.keepalive_held = False
    owner.clock.advance(10)
    timers.tick()
    assert owner.pings == [60]
    keepalive.cancel()
    owner.clock.advance(100)
    timers.tick()
    assert owner.expired == [] and timers.deadline is None


def test_a_session_with_one_timer_then_several_then_one_again() -> None:
    clock = Clock()
    timers = Timers(clock.seconds)
    ran: list[str] = []
    first = timers.call_later(3, lambda: ran.append("first"))
    assert timers.pending == [first] and timers.deadline == 3
    second = timers.call_later(1, lambda: ran.append("second"))
    third = timers.call_later(2, lambda: ran.append("third"))
    assert timers.pending == [first, second, third] and timers.deadline == 1
    third.cancel()
    clock.advance(1)
    timers.tick()
    assert ran == ["second"] and timers.pending == [first] and timers.deadline == 3
    clock.advance(2)
    timers.tick()
    assert ran == ["second", "first"] and timers.pending == [] and timers.deadline is None
    assert not first.active and not second.active and not third.active


def test_a_cancelled_keepalive_lets_its_session_go_before_its_deadline() -> None:
    import gc
    import weakref

    owner = Owner()
    clock = owner.clock
    queue = TimerQueue(clock.seconds)
    other = Timers(clock.seconds, queue)
    other.call_later(1000, lambda: None)  # the queue is not emptied by the cancel below
    timers = Timers(clock.seconds, queue)
    Keepalive(timers, 30, owner)
    gone = weakref.ref(owner)
    timers.cancel_all()  # the connection closed; its keepalive waits in the heap, marked
    del owner
    gc.collect()
    assert gone() is None


def test_cancels_made_by_a_running_call_leave_the_tick_and_the_count_right() -> None:
    clock = Clock()
    queue = TimerQueue(clock.seconds)
    sessions = [Timers(clock.seconds, queue) for _ in range(3)]
    ran: list[int] = []
    later = [sessions[1].call_later(50 + i, lambda i=i: ran.append(i)) for i in range(100)]

    def cancel_most() -> None:  # enough for the heap to be rebuilt under the tick
        ran.append(-1)
        for timer in later[:90]:
            timer.cancel()

    sessions[0].call_later(1, cancel_most)
    sessions[2].call_later(1, lambda: ran.append(-2))
    clock.advance(1)
    queue.tick()
    assert ran == [-1, -2]
    assert len(queue) == 10
    clock.advance(200)
    queue.tick()
    assert ran == [-1, -2, *range(90, 100)]
    assert len(queue) == 0 and queue.deadline is None
