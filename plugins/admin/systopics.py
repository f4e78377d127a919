"""``_sys/broker/...``: the broker's state published as ordinary messages, Mosquitto's
``$SYS`` for clients that prefer subscribing to scraping (``$`` is no valid SSMP id).

Every ``--admin-sys-interval`` seconds the plugin publishes one MCAST per topic below, its
payload the value as decimal text, from the sender ``_sys``, through the hub like any
message: any protocol subscribes to them (sbus with a pattern such as ``_sys/broker/#``).
A topic nobody subscribes to costs one lookup. They are not retained: a new subscriber
hears them at the next interval. They are counted apart (``msgbroker_sys_messages``): not
in any protocol's received messages, and never ranked among the busiest topics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from msgbroker import Kind, Message

from .sampler import SYS_PREFIX, Sample

if TYPE_CHECKING:
    from msgbroker.broker import Broker

#: the sender of every ``_sys`` message
SENDER = "_sys"
#: the protocol name ``_sys`` messages carry (the journal records it)
PROTOCOL = "admin"

#: (topic, what it carries) for the documentation and the tests; ``PROTOCOL`` stands for
#: each protocol the broker speaks
TOPICS = (
    ("_sys/broker/version", "the broker's version"),
    ("_sys/broker/node", "the broker's node name (--node-name)"),
    ("_sys/broker/uptime", "seconds since it started"),
    ("_sys/broker/connections", "open connections"),
    ("_sys/broker/connections/PROTOCOL", "open connections of one protocol"),
    ("_sys/broker/messages/received", "messages clients published"),
    ("_sys/broker/messages/received/per-second", "the same, per second, over the last sample"),
    ("_sys/broker/messages/sent", "messages delivered to clients"),
    ("_sys/broker/messages/sent/per-second", "the same, per second, over the last sample"),
    ("_sys/broker/messages/dropped", "deliveries slow-consumer policies dropped"),
    ("_sys/broker/bytes/received", "bytes read from clients"),
    ("_sys/broker/bytes/sent", "bytes written to clients"),
    ("_sys/broker/logins", "logins accepted"),
    ("_sys/broker/logins/failed", "logins refused"),
    ("_sys/broker/slow-consumers/disconnected", "connections closed as slow consumers"),
    ("_sys/broker/topics", "topics with subscribers"),
)


def values(
    sample: Sample, version: str, protocols: list[str], own_deliveries: int = 0, node: str = ""
) -> list[tuple[str, str]]:
    """(topic, payload text) for every ``_sys`` topic, from ``sample``; ``own_deliveries``:
    the deliveries of ``_sys`` messages, left out of the messages sent; ``node``: the
    broker's node name."""
    traffic = sample.traffic.values()
    received = sum(t.messages_in for t in traffic)
    sent = sample.delivered - own_deliveries
    rates = sample.rates.values()
    out = [
        ("version", version),
        ("node", node),
        ("uptime", f"{sample.uptime:.0f}"),
        ("connections", str(sum(sample.connections.values()))),
    ]
    out += [(f"connections/{name}", str(sample.connections.get(name, 0))) for name in protocols]
    out += [
        ("messages/received", str(received)),
        ("messages/received/per-second", f"{sum(r['messages_in'] for r in rates):.1f}"),
        ("messages/sent", str(sent)),
        ("messages/sent/per-second", f"{sample.delivery_rate:.1f}"),
        ("messages/dropped", str(sample.dropped)),
        ("bytes/received", str(sum(t.bytes_in for t in traffic))),
        ("bytes/sent", str(sum(t.bytes_out for t in traffic))),
        ("logins", str(sample.logins)),
        ("logins/failed", str(sample.login_failures)),
        ("slow-consumers/disconnected", str(sample.slow_disconnects)),
        ("topics", str(sample.topic_count)),
    ]
    return [(f"{SYS_PREFIX}broker/{name}", text) for name, text in out]


class SysPublisher:
    """Publishes the ``_sys`` topics of one broker (call :meth:`publish` per interval)."""

    def __init__(self, broker: Broker, version: str) -> None:
        self.broker = broker
        self.version = version
        #: messages published, and deliveries they made
        self.published = 0
        self.delivered = 0

    def publish(self, sample: Sample) -> None:
        broker = self.broker
        hub = broker.hub
        listed = values(
            sample, self.version, sorted(broker.protocols), self.delivered, broker.node_name
        )
        for topic, text in listed:
            message = Message(Kind.MCAST, SENDER, PROTOCOL, topic, text.encode())
            self.delivered += hub.multicast(None, message)
            self.published += 1
        broker.batcher.flush()
