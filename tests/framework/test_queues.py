"""Queue groups in the hub: one member per group gets each MCAST, round-robin among those
whose filters match and that have room; waiting messages; redelivery of unacknowledged
ones (framework/queues.py)."""

from __future__ import annotations

from attrs import define, field
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.filters import Filter
from msgbroker.hub import Hub
from msgbroker.message import Kind, Message, MessageRun
from msgbroker.queues import MESSAGE_OVERHEAD
from msgbroker.topics import HubLimits


def encode(message: Message) -> bytes | None:
    if message.payload == b"uncarriable":
        return None
    return message.payload


@define(eq=False)
class Consumer:
    """A hub peer with an ack window: ``ready()`` while fewer than ``window`` messages are
    unacknowledged; ``deliver_queued`` keeps them as a protocol with acks would."""

    identity: str | None = None
    protocol: str = "q"
    encode: object = encode
    subscriptions: dict = field(factory=dict)
    sent: list = field(factory=list)
    window: int = 1000
    unacked: list = field(factory=list)

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)

    def deliver_queued(self, frame, message, group) -> None:
        self.sent.append(frame)
        self.unacked.append((message, group))

    def ready(self) -> bool:
        return len(self.unacked) < self.window

    def ack_all(self) -> None:
        self.unacked.clear()

    def kick(self, reason: str) -> None:
        pass


def joined(hub, name, topic="t", queue="g", **options):
    consumer = Consumer(window=options.pop("window", 1000))
    hub.login(consumer, name)
    hub.subscribe(consumer, topic, queue=queue, **options)
    return consumer


def publish(hub, sender, payload, topic="t", **properties):
    message = Message(Kind.MCAST, "pub", "q", topic, payload, properties=properties or None)
    return hub.multicast(sender, message)


def publisher(hub):
    p = Consumer()
    hub.login(p, "pub")
    return p


def test_each_message_goes_to_one_member_round_robin_and_to_every_plain_subscriber():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a"), joined(hub, "b")
    plain = Consumer()
    hub.login(plain, "plain")
    hub.subscribe(plain, "t")
    for i in range(4):
        assert publish(hub, pub, b"%d" % i) == 2  # one queue member + the plain subscriber
    assert a.sent == [b"0", b"2"]
    assert b.sent == [b"1", b"3"]
    assert plain.sent == [b"0", b"1", b"2", b"3"]


def test_two_groups_each_get_every_message_once():
    hub = Hub()
    pub = publisher(hub)
    g1 = [joined(hub, f"x{i}", queue="one") for i in range(2)]
    g2 = [joined(hub, f"y{i}", queue="two") for i in range(3)]
    for i in range(6):
        publish(hub, pub, b"%d" % i)
    every = sorted(b"%d" % i for i in range(6))
    assert sorted(frame for c in g1 for frame in c.sent) == every
    assert sorted(frame for c in g2 for frame in c.sent) == every


def test_a_member_without_room_is_passed_over_and_a_full_group_waits():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a", window=1), joined(hub, "b", window=1)
    publish(hub, pub, b"1")
    publish(hub, pub, b"2")
    assert publish(hub, pub, b"3") == 0  # both windows full: it waits in the group
    assert publish(hub, pub, b"4") == 0
    assert (a.sent, b.sent) == ([b"1"], [b"2"])  # a consumer holds at most its window
    b.ack_all()
    assert hub.ready(b) == 1  # b has room: it takes the oldest waiting message
    assert b.sent == [b"2", b"3"]
    a.ack_all()
    assert hub.ready(a) == 1
    assert a.sent == [b"1", b"4"]
    assert not hub.topics["t"].queues["g"].backlog


def test_filters_choose_among_the_members():
    hub = Hub()
    pub = publisher(hub)
    big = joined(hub, "big", filters=[Filter("n", ">", 10)])
    small = joined(hub, "small", filters=[Filter("n", "<=", 10)])
    publish(hub, pub, b"5", n=5)
    publish(hub, pub, b"50", n=50)
    assert publish(hub, pub, b"none") == 0  # no properties: no member matches; not kept
    assert (big.sent, small.sent) == ([b"50"], [b"5"])
    assert not hub.topics["t"].queues["g"].backlog


def test_unacknowledged_messages_of_a_member_that_leaves_go_to_another():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a"), joined(hub, "b")
    for i in range(4):
        publish(hub, pub, b"%d" % i)
    assert a.sent == [b"0", b"2"]
    gone = list(a.unacked)
    hub.close(a)  # the connection closed: its protocol gives back what was not acked
    for message, group in gone:
        group.redeliver(message)
    assert b.sent == [b"1", b"3", b"0", b"2"]


def test_redelivery_with_nobody_left_is_counted_as_dropped():
    hub = Hub()
    pub = publisher(hub)
    a = joined(hub, "a")
    publish(hub, pub, b"1")
    ((message, group),) = a.unacked
    hub.close(a)
    assert "t" not in hub.topics
    group.redeliver(message)
    assert hub.stats.dropped == 1


def test_a_new_member_takes_waiting_messages_at_once():
    hub = Hub()
    pub = publisher(hub)
    a = joined(hub, "a", window=1)
    publish(hub, pub, b"1")
    publish(hub, pub, b"2")  # waits
    b = joined(hub, "b")
    assert (a.sent, b.sent) == ([b"1"], [b"2"])
    assert hub.stats.delivered == 2


def test_the_sender_never_gets_its_own_message_and_an_uncarriable_one_skips_a_member():
    hub = Hub()
    a, b = joined(hub, "a"), joined(hub, "b")
    publish(hub, a, b"x")  # a publishes: b gets it
    assert (a.sent, b.sent) == ([], [b"x"])
    assert publish(hub, a, b"uncarriable") == 0
    assert not hub.topics["t"].queues["g"].backlog  # nobody could ever take it


def test_queue_members_see_presence_and_broadcasts_and_leave_cleanly():
    hub = Hub()
    watcher = Consumer()
    hub.login(watcher, "w")
    hub.subscribe(watcher, "t", presence=True)
    a = joined(hub, "a")
    assert len(watcher.sent) == 1  # the presence event of a's joining
    assert hub.broadcast(watcher, Message(Kind.BCAST, "w", "q", None, b"all")) == 1
    assert a.sent == [b"all"]
    hub.unsubscribe(a, "t")
    assert hub.topics["t"].queues is None or "g" not in hub.topics["t"].queues


def test_runs_to_a_topic_with_a_queue_are_routed_one_by_one():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a"), joined(hub, "b")
    run = MessageRun(Kind.MCAST, "pub", "q", "t", 2, lambda: [b"1", b"2"])
    assert hub.multicast_run(pub, run) == 2
    assert (a.sent, b.sent) == ([b"1"], [b"2"])


def test_a_redelivered_message_goes_ahead_of_newer_waiting_ones():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a", window=1), joined(hub, "b", window=1)
    for i in range(3):
        publish(hub, pub, b"%d" % i)  # a: 0, b: 1, 2 waits
    ((message, group),) = a.unacked
    hub.close(a)
    group.redeliver(message)  # b has no room: 0 waits, ahead of 2
    b.ack_all()
    hub.ready(b)
    assert b.sent == [b"1", b"0"]
    b.ack_all()
    hub.ready(b)
    assert b.sent == [b"1", b"0", b"2"]


def test_the_observer_counts_the_queue_member_that_took_the_message():
    hub = Hub()
    seen = []
    hub.observer = lambda message, result: seen.append((message.payload, dict(result.recipients)))
    pub = publisher(hub)
    joined(hub, "a", window=1)
    plain = Consumer(protocol="p")
    hub.login(plain, "plain")
    hub.subscribe(plain, "t")
    publish(hub, pub, b"1")
    publish(hub, pub, b"2")  # the member has no room: it waits, not counted now
    assert seen == [(b"1", {"q": 1, "p": 1}), (b"2", {"p": 1})]


# -- the backlog's bound, in bytes ---------------------------------------------------------------


def cost(*payloads):
    return sum(len(p) + MESSAGE_OVERHEAD for p in payloads)


def held(hub):
    group = hub.topics["t"].queues["g"]
    return group.backlog_bytes, [m.payload for m in group.backlog]


def bounded_hub(limit):
    return Hub(HubLimits(queue_backlog=limit))


def test_waiting_messages_count_their_payload_and_overhead_and_return_to_zero_when_taken():
    hub = Hub()
    pub = publisher(hub)
    a = joined(hub, "a", window=1)
    for payload in (b"0", b"x" * 1000, b"", b"y" * 70000):
        publish(hub, pub, payload)
    assert held(hub) == (cost(b"x" * 1000, b"", b"y" * 70000), [b"x" * 1000, b"", b"y" * 70000])
    for _ in range(3):
        a.ack_all()
        hub.ready(a)
    assert held(hub) == (0, [])
    assert a.sent == [b"0", b"x" * 1000, b"", b"y" * 70000]


def test_a_waiting_message_counts_the_frames_encoded_for_it_too():
    # a protocol's encoder makes a frame as large as the payload again, and the message
    # keeps it (memoized) while it waits: a bound on payloads alone would hold twice as much
    def framing(message):
        return b"<" + message.payload + b">"

    hub = Hub()
    pub = publisher(hub)
    a = Consumer(window=1, encode=framing)
    hub.login(a, "a")
    hub.subscribe(a, "t", queue="g")
    publish(hub, pub, b"first")
    publish(hub, pub, b"x" * 1000)
    assert held(hub) == (1000 + 1002 + MESSAGE_OVERHEAD, [b"x" * 1000])
    a.ack_all()
    hub.ready(a)
    assert held(hub) == (0, [])


def test_past_the_bound_the_oldest_are_dropped_and_counted():
    hub = bounded_hub(cost(b"a" * 100) * 3)
    pub = publisher(hub)
    joined(hub, "a", window=1)
    publish(hub, pub, b"first")  # taken by the member
    for i in range(5):
        publish(hub, pub, b"%d" % i * 100)
    assert held(hub) == (cost(b"a" * 100) * 3, [b"2" * 100, b"3" * 100, b"4" * 100])
    assert hub.stats.dropped == 2
    publish(hub, pub, b"z" * 150)  # 50 bytes over: one more (the oldest) goes
    assert held(hub) == (cost(b"4" * 100, b"z" * 150), [b"4" * 100, b"z" * 150])
    assert hub.stats.dropped == 4


def test_one_message_larger_than_the_bound_is_kept_alone():
    hub = bounded_hub(1000)
    pub = publisher(hub)
    joined(hub, "a", window=1)
    publish(hub, pub, b"first")
    publish(hub, pub, b"small")
    publish(hub, pub, b"B" * 5000)  # the newest is always kept: it goes next
    assert held(hub) == (cost(b"B" * 5000), [b"B" * 5000])
    assert hub.stats.dropped == 1


def test_the_last_member_leaving_empties_the_backlog_and_counts_it_dropped():
    hub = Hub()
    pub = publisher(hub)
    a = joined(hub, "a", window=1)
    for payload in (b"1", b"2", b"3"):
        publish(hub, pub, payload)
    group = hub.topics["t"].queues["g"]
    hub.close(a)
    assert (group.backlog_bytes, list(group.backlog)) == (0, [])
    assert hub.stats.dropped == 2  # a's unacknowledged "1" is its protocol's to give back


def test_a_redelivered_message_is_counted_and_drained_back_to_zero():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a", window=1), joined(hub, "b", window=1)
    for payload in (b"aa", b"bbb", b"cccc"):
        publish(hub, pub, payload)  # a: aa, b: bbb, cccc waits
    ((message, group),) = a.unacked
    hub.close(a)
    group.redeliver(message)  # b has no room: aa waits ahead of cccc
    assert held(hub) == (cost(b"aa", b"cccc"), [b"aa", b"cccc"])
    for _ in range(2):
        b.ack_all()
        hub.ready(b)
    assert held(hub) == (0, [])
    assert b.sent == [b"bbb", b"aa", b"cccc"]


def test_a_redelivery_may_pass_the_bound_until_the_next_message_is_kept():
    # the redelivered messages were already in memory (the leaving member held them):
    # nothing is lost at once, and the next message kept trims the oldest as usual
    hub = bounded_hub(cost(b"x" * 10) * 2)
    pub = publisher(hub)
    a = joined(hub, "a", window=3)
    joined(hub, "b", window=1)
    for i in range(5):
        publish(hub, pub, b"%d" % i * 10)  # a: 0, 2, 3 (b full after 1), 4 waits
    gone = list(a.unacked)
    hub.close(a)
    for message, group in gone:
        group.redeliver(message)
    assert held(hub)[0] == cost(b"x" * 10) * 4  # over the bound, counted right
    publish(hub, pub, b"5" * 10)
    assert held(hub)[0] == cost(b"x" * 10) * 2
    assert hub.stats.dropped == 3


operations = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 3000)),
        st.tuples(st.just("ack"), st.sampled_from("ab")),
        st.tuples(st.just("leave"), st.sampled_from("ab")),
        st.tuples(st.just("join"), st.sampled_from("ab")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(0, 8000))
def test_the_byte_count_is_exact_under_any_sequence_and_a_kept_message_restores_the_bound(
    ops, limit
):
    hub = bounded_hub(limit)
    pub = publisher(hub)
    members = {name: joined(hub, name, window=2) for name in "ab"}
    for op, arg in ops:
        if op == "publish":
            before = hub.stats.dropped
            publish(hub, pub, b"p" * arg)
            group = hub.topics.get("t") and (hub.topics["t"].queues or {}).get("g")
            if group is not None and group.backlog and group.backlog[-1].payload == b"p" * arg:
                # it was kept: within the bound, or alone
                assert group.backlog_bytes <= limit or len(group.backlog) == 1
                assert hub.stats.dropped >= before
        elif op == "ack" and arg in members:
            members[arg].ack_all()
            hub.ready(members[arg])
        elif op == "leave" and arg in members:
            member = members.pop(arg)
            hub.close(member)
            for message, group in member.unacked:
                group.redeliver(message)
        elif op == "join" and arg not in members:
            members[arg] = joined(hub, arg + "2", window=2)
        topic = hub.topics.get("t")
        group = topic.queues.get("g") if topic is not None and topic.queues else None
        if group is not None:
            assert group.backlog_bytes == cost(*(m.payload for m in group.backlog))


def test_several_redelivered_messages_keep_their_order_ahead_of_newer_ones():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a", window=3), joined(hub, "b", window=1)
    for i in range(5):
        publish(hub, pub, b"%d" % i)  # a: 0, 2, 3; b: 1; 4 waits
    assert [m.payload for m, _ in a.unacked] == [b"0", b"2", b"3"]
    group = a.unacked[0][1]
    messages = [m for m, _ in a.unacked]
    hub.close(a)
    assert group.redeliver_all(messages) == 0  # b has no room: all three wait, in order
    for _ in range(4):
        b.ack_all()
        hub.ready(b)
    assert b.sent == [b"1", b"0", b"2", b"3", b"4"]
    assert group.backlog_bytes == 0


def test_redelivered_messages_go_straight_to_a_member_with_room_in_order():
    hub = Hub()
    pub = publisher(hub)
    a, b = joined(hub, "a", window=2), joined(hub, "b", window=10)
    publish(hub, pub, b"0")  # a
    publish(hub, pub, b"1")  # b
    publish(hub, pub, b"2")  # a
    messages = [m for m, _ in a.unacked]
    group = a.unacked[0][1]
    hub.close(a)
    assert group.redeliver_all(messages) == 2
    assert b.sent == [b"1", b"0", b"2"]


def test_the_hub_gives_back_a_leaving_members_messages_to_each_group_in_order_and_counts():
    hub = Hub()
    pub = publisher(hub)
    a = joined(hub, "a", window=10)
    hub.subscribe(a, "u", queue="h")
    b, c = joined(hub, "b", window=10), joined(hub, "c", topic="u", queue="h", window=1)
    for i in range(4):
        publish(hub, pub, b"t%d" % i)  # a: t0, t2; b: t1, t3
        publish(hub, pub, b"u%d" % i, topic="u")  # c: u1 (its window of one); a: the rest
    assert [m.payload for m, _ in a.unacked] == [b"t0", b"u0", b"t2", b"u2", b"u3"]
    taken = list(a.unacked)
    hub.close(a)
    delivered = hub.stats.delivered
    assert hub.redeliver(taken) == 2  # t0 and t2 to b; c has no room: u0, u2, u3 wait
    assert hub.stats.delivered == delivered + 2
    assert b.sent[-2:] == [b"t0", b"t2"]
    for _ in range(3):
        c.ack_all()
        hub.ready(c)
    assert c.sent == [b"u1", b"u0", b"u2", b"u3"]
