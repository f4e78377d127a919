"""The broker's limits as plain rules: rate-limited log lines, the failed-login throttle,
connection counts, and the output budget shared by every slow consumer."""

from __future__ import annotations

from twisted.internet.task import Clock

from msgbroker.limits import ConnectionLimits, LoginThrottle, RateLimitedLog
from msgbroker.output import OutputBudget
from msgbroker.reasons import CloseReason
from tests.framework.test_output import make_output


def test_rate_limited_log_says_one_line_per_key_per_interval_and_counts_the_rest():
    said = []
    log = RateLimitedLog(lambda text, more: said.append((text, more)), interval=10.0)
    log("a", 0.0, "a1")
    log("a", 1.0, "a2")
    log("b", 2.0, "b1")
    log("a", 9.9, "a3")
    assert said == [("a1", 0), ("b1", 0)]
    log("a", 10.0, "a4")
    assert said[-1] == ("a4", 2)  # a2 and a3 were suppressed
    log("a", 20.0, "a5")
    assert said[-1] == ("a5", 0)


def test_login_throttle_lets_a_burst_of_failures_through_then_refuses_until_refilled():
    throttle = LoginThrottle(rate=2.0)
    for _ in range(2):  # the bucket holds max(rate, 1) tokens
        assert throttle.allows("10.0.0.1", 0.0)
        throttle.failed("10.0.0.1", 0.0)
    assert not throttle.allows("10.0.0.1", 0.0)
    assert throttle.allows("10.0.0.2", 0.0)  # another address has its own bucket
    assert not throttle.allows("10.0.0.1", 0.4)
    assert throttle.allows("10.0.0.1", 0.5)  # one token back after 1/rate seconds


def test_login_throttle_counts_only_failures():
    throttle = LoginThrottle(rate=1.0)
    for _ in range(100):  # successful logins never call failed()
        assert throttle.allows("h", 0.0)
    throttle.failed("h", 0.0)
    assert not throttle.allows("h", 0.5)


def test_login_throttle_rate_zero_is_off():
    throttle = LoginThrottle(rate=0.0)
    for _ in range(10):
        throttle.failed("h", 0.0)
    assert throttle.allows("h", 0.0)


def test_login_throttle_forgets_refilled_addresses_when_it_holds_many():
    throttle = LoginThrottle(rate=1.0)
    for i in range(65_536):
        throttle.failed(f"h{i}", 0.0)
    throttle.failed("late", 100.0)  # everyone else has refilled by now
    assert len(throttle._buckets) == 1


def test_connection_limits_total_and_per_address():
    limits = ConnectionLimits(max_total=3, max_per_address=2)
    assert limits.refusal("a") is None
    limits.opened("a")
    limits.opened("a")
    assert limits.refusal("a") == "max-connections-per-address"
    assert limits.refusal("b") is None
    limits.opened("b")
    assert limits.refusal("c") == "max-connections"
    limits.closed("a")
    assert limits.refusal("a") is None
    limits.closed("a")
    limits.closed("b")
    assert limits.total == 0 and limits.by_address == {}


def test_connection_limits_zero_is_no_limit_and_local_peers_count_in_total_only():
    limits = ConnectionLimits(max_total=0, max_per_address=1)
    for _ in range(5):
        assert limits.refusal("") is None
        limits.opened("")
    assert limits.total == 5


# -- the output budget -----------------------------------------------------------------------


class Member:
    """A budget member whose real backlog is ``queued`` and whose cut is recorded."""

    def __init__(self, queued, drops=False):
        self.queued = queued
        self.drops = drops
        self.was_cut = False

    def measure(self):
        return self.queued

    def cut(self):
        self.was_cut = True
        return not self.drops


def test_budget_admits_within_the_limit():
    budget = OutputBudget(100)
    a = Member(60)
    assert budget.admits(a, 60)
    budget.update(a, 60)
    assert budget.total == 60


def test_budget_cuts_the_largest_backlog_first():
    budget = OutputBudget(100)
    big, small, asking = Member(70), Member(20), Member(0)
    budget.update(big, 70)
    budget.update(small, 20)
    assert budget.admits(asking, 30)
    assert big.was_cut and not small.was_cut
    assert budget.total == 20 and big not in budget.members


def test_budget_refuses_the_asker_when_it_is_the_largest():
    budget = OutputBudget(100)
    other, asking = Member(30), Member(70)
    budget.update(other, 30)
    budget.update(asking, 70)
    assert not budget.admits(asking, 80)
    assert not other.was_cut
    assert budget.cuts == 1


def test_budget_measures_before_cutting_a_backlog_that_drained():
    budget = OutputBudget(100)
    drained, asking = Member(90), Member(0)
    budget.update(drained, 90)
    drained.queued = 10  # its peer read most of it meanwhile
    assert budget.admits(asking, 50)
    assert not drained.was_cut
    assert budget.total == 10


def test_budget_drop_policy_members_keep_their_backlog_and_the_asker_is_refused():
    budget = OutputBudget(100)
    dropper, asking = Member(90, drops=True), Member(0)
    budget.update(dropper, 90)
    assert not budget.admits(asking, 20)
    assert dropper.was_cut  # told to take nothing more
    assert budget.total == 90


def test_budget_zero_is_no_limit():
    budget = OutputBudget(0)
    a = Member(0)
    assert budget.admits(a, 10**12)


# -- sessions in the budget -----------------------------------------------------------------


def make_session(budget, drop=False, max_backlog=1 << 20):
    session, output, wire, link, batcher = make_output(max_backlog, drop, budget)
    return session, output, wire, link.closed, batcher


def test_paused_sessions_share_the_budget_and_the_largest_is_disconnected():
    budget = OutputBudget(1000)
    big, big_output, big_wire, big_closed, batcher = make_session(budget)
    small, small_output, small_wire, small_closed, _ = make_session(budget)
    small_output.batcher = batcher
    big_wire.fill()
    small_wire.fill()
    for _ in range(7):
        big.send(b"x" * 100)
        batcher.flush()
    for _ in range(2):
        small.send(b"y" * 100)
        batcher.flush()
    assert budget.total == 900
    small.send(b"y" * 200)  # over the budget: the largest backlog goes first
    batcher.flush()
    assert big_closed == [CloseReason.SLOW_CONSUMER] and small_closed == []
    assert budget.total == 400
    assert small_output.held_bytes == 400 and big_output.held_bytes == 0
    big_wire.drain()
    assert bytes(big_wire.data) == b""  # cut: nothing it held is written


def test_a_drop_policy_session_over_the_budget_drops_and_reports_it():
    budget = OutputBudget(250)
    dropped = []
    session, output, wire, closed, batcher = make_session(budget, drop=True)
    session.on_dropped = lambda s, n: dropped.append(n)
    wire.fill()
    session.send(b"a" * 200)
    batcher.flush()
    session.send(b"b" * 100)  # would pass the broker's budget: dropped, not queued
    batcher.flush()
    assert closed == [] and dropped == [1]
    assert session.dropped == 1 and session.stats.dropped == 1
    wire.drain()
    assert bytes(wire.data) == b"a" * 200


def test_a_session_leaves_the_budget_when_it_drains_or_stops():
    budget = OutputBudget(10_000)
    session, output, wire, _, batcher = make_session(budget)
    wire.fill()
    session.send(b"z" * 500)
    batcher.flush()
    assert budget.total == 500
    wire.drain()
    assert budget.total == 0 and not budget.members
    wire.fill()
    session.send(b"z" * 300)
    batcher.flush()
    output.stop()
    assert budget.total == 0


def test_slow_consumer_disconnect_and_drops_are_logged():
    from msgbroker import Broker, BrokerConfig

    clock = Clock()
    broker = Broker(BrokerConfig(max_output=100), clock)
    lines = []
    broker.rate_limited_log.emit = lambda text, more: lines.append(text)
    from msgbroker.plugins.ssmp.protocol import SSMPServerSession
    from msgbroker.testing import SessionDriver

    driver = SessionDriver(broker, SSMPServerSession, host="h")
    session = driver.session
    session.identity = "alice"
    driver.wire.fill()
    session.output.reply(b"r" * 200)  # over the broker's budget: a reply is never dropped
    broker.batcher.flush()  # the end of the reactor turn
    assert session.close_reason == "slow consumer"
    assert any("slow ssmp consumer alice (h) disconnected" in line for line in lines)

    drop_broker = Broker(BrokerConfig(max_output=100, slow_consumer="drop"), clock)
    drop_lines = []
    drop_broker.rate_limited_log.emit = lambda text, more: drop_lines.append(text)
    dropping = SessionDriver(drop_broker, SSMPServerSession, host="")
    dropping.wire.fill()
    dropping.session.send(b"d" * 200)
    drop_broker.batcher.flush()  # deliveries are written (or dropped) once per batch
    assert dropping.session.dropped == 1
    assert drop_lines == ["slow ssmp consumer - (local): 1 deliveries dropped (1 in all)"]


def test_holding_a_sessions_input_is_counted_per_holder():
    from msgbroker.plugins.ssmp.protocol import SSMPServerSession
    from msgbroker.testing import SessionDriver, make_broker

    driver = SessionDriver(make_broker(), SSMPServerSession)
    session = driver.session
    session.hold_reading("flood control")
    session.hold_reading("login")
    assert session.reading_held and driver.reading_paused
    session.release_reading("login")  # the other holder still holds it
    assert session.reading_held and driver.reading_paused
    session.release_reading("login")  # a second release of one holder changes nothing
    assert driver.reading_paused
    session.release_reading("flood control")
    assert not session.reading_held and not driver.reading_paused


def test_letting_go_of_a_large_backlog_is_reported_once():
    released = []
    budget = OutputBudget(0, lambda: released.append(True))
    a, b = Member(0), Member(0)
    budget.update(a, 2 << 20)
    budget.update(b, 1000)
    budget.update(b, 0)  # small: not worth a trim
    assert released == []
    budget.update(a, 0)
    assert released == [True]
