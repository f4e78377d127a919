"""The counters the metrics read (sessions', topics', the broker's) and the sampler that
turns them into rates, on a fake clock and in-memory connections."""

from __future__ import annotations

from msgbroker import BrokerConfig
from msgbroker.plugins.admin.sampler import Sampler
from msgbroker.plugins.admin.systopics import SysPublisher, values
from msgbroker.testing import connect, make_broker


def logged_in(broker, name):
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN %s open\n" % name.encode())
    assert conn.received() == b"200\n"
    return conn


def test_a_session_counts_its_traffic_per_input():
    broker = make_broker()
    reader = logged_in(broker, "reader")
    reader.send(b"SUBSCRIBE t\n")
    writer = logged_in(broker, "writer")
    # one chunk of pipelined MCASTs: routed as a run, counted once for the chunk
    chunk = b"".join(b"MCAST t m%d\n" % i for i in range(50))
    writer.send(chunk)
    assert writer.received() == b"200\n" * 50
    session = writer.session
    assert session.messages_in == 50
    assert session.bytes_in == len(b"LOGIN writer open\n") + len(chunk)
    assert session.bytes_out == len(b"200\n") * 51
    assert session.frames_out == 0
    delivered = reader.received()
    assert delivered.count(b"\n") == 51  # the subscription's 200 and the 50 messages
    assert reader.session.frames_out >= 1  # frames: a run may be one frame
    assert reader.session.bytes_out == len(b"200\n") + len(delivered)  # and the login's
    assert broker.hub.topics["t"].published == 50


def test_single_messages_count_too():
    broker = make_broker()
    reader = logged_in(broker, "reader")
    reader.send(b"SUBSCRIBE t\n")
    writer = logged_in(broker, "writer")
    for i in range(3):
        writer.send(b"MCAST t x%d\n" % i)
        writer.send(b"UCAST reader hi\n")
    assert writer.session.messages_in == 6
    assert broker.hub.topics["t"].published == 3


def test_the_broker_counts_logins_closes_and_keeps_the_traffic_of_closed_sessions():
    broker = make_broker(BrokerConfig(auth=("open",), login_attempts=100))
    good = logged_in(broker, "good")
    good.send(b"MCAST t x\n")
    bad = connect(broker, "ssmp")
    bad.send(b"LOGIN mallory nonsense-scheme x\n")
    broker.reactor.advance(5)  # the refusal is answered late
    assert broker.counters.logins == 1
    assert broker.counters.login_failures == 1
    good.send(b"CLOSE\n")
    assert good.closed
    traffic = broker.traffic()["ssmp"]
    assert traffic.connections == 2
    assert traffic.messages_in == 1
    assert traffic.bytes_in >= len(b"LOGIN good open\nMCAST t x\nCLOSE\n")
    assert broker.counters.closed["close requested"] == 1
    # sessions get numbers in the order they open
    assert bad.session.id == 2


def test_the_sampler_ranks_the_busiest_topics_and_bounds_them():
    broker = make_broker()
    reader = logged_in(broker, "reader")
    for i in range(30):
        reader.send(b"SUBSCRIBE topic%d\n" % i)
    reader.send(b"SUBSCRIBE _sys/broker/connections\n")
    writer = logged_in(broker, "writer")
    sampler = Sampler(broker, top=5)
    sampler.sample()
    for i in range(30):
        writer.send(b"".join(b"MCAST topic%d x\n" % i for _ in range(i + 1)))
    sys_publisher = SysPublisher(broker, "1.0")
    broker.reactor.advance(2.0)
    sys_publisher.publish(sampler.latest)
    sample = sampler.sample()
    assert [t.topic for t in sample.topics] == [f"topic{i}" for i in (29, 28, 27, 26, 25)]
    assert sample.topics[0].published == 30
    assert sample.topics[0].rate == 15.0  # 30 in 2 seconds
    assert sample.topics[0].subscribers == 1
    assert sampler.topic_rates["topic0"] == 0.5
    assert "_sys/broker/connections" not in sampler.topic_rates
    rates = sample.rates["ssmp"]
    assert rates["messages_in"] == sum(range(1, 31)) / 2.0
    assert sample.connections == {"ssmp": 2}
    # the next interval: nothing moved
    broker.reactor.advance(1.0)
    quiet = sampler.sample()
    assert quiet.topics[0].rate == 0.0
    assert quiet.rates["ssmp"]["messages_in"] == 0.0
    # the _sys message reached its subscriber, from the sender _sys, and no protocol
    # counted it as received
    assert b"000 _sys MCAST _sys/broker/connections 2\n" in reader.received()
    assert quiet.traffic["ssmp"].messages_in == sum(range(1, 31))
    assert sys_publisher.published == len(values(quiet, "1.0", sorted(broker.protocols)))


def test_slow_consumers_are_listed_worst_first():
    broker = make_broker(BrokerConfig(auth=("open",), slow_consumer="drop", max_backlog=100))
    slow = logged_in(broker, "slow")
    slow.send(b"SUBSCRIBE t\n")
    slow.received()
    slow.transport.producer.pauseProducing()  # its socket's buffer is full
    writer = logged_in(broker, "writer")
    for i in range(20):
        writer.send(b"MCAST t message-%04d\n" % i)
    sample = Sampler(broker).sample()
    (listed,) = sample.slow
    assert listed["identity"] == "slow"
    assert listed["backlog"] > 0
    assert listed["dropped"] > 0
    assert sample.dropped == listed["dropped"]


def test_slow_consumer_disconnects_are_remembered_for_the_dashboard():
    from msgbroker.plugins.admin.plugin import ACTIVE, running_admin
    from msgbroker.plugins.admin.server import Admin
    from msgbroker.plugins.admin.settings import AdminSettings

    broker = make_broker(BrokerConfig(auth=("open",), max_backlog=100))
    admin = Admin(broker, AdminSettings(endpoint="tcp:0"), b"secret")  # never listens
    broker.add_plugin(admin, name=ACTIVE)
    assert running_admin(broker) is admin
    slow = logged_in(broker, "slow")
    slow.send(b"SUBSCRIBE t\n")
    slow.received()
    slow.transport.producer.pauseProducing()
    writer = logged_in(broker, "writer")
    for i in range(20):
        writer.send(b"MCAST t message-%04d\n" % i)
    assert slow.closed
    (closed,) = admin.info()["slow_closed"]
    assert closed["identity"] == "slow"
    assert closed["protocol"] == "ssmp"
    assert closed["dropped"] > 0
    assert admin.sampler.sample().slow_disconnects == 1
