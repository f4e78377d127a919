"""Micromessage2 queue group members for the cluster tests: real Twisted MM2 clients in the
nodes' reactor thread, and a tally of every queue message any member got, which a test
waits on (a Deferred), never sleeping."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from twisted.internet import defer

from msgbroker.plugins.mm2.client import connect
from tests.cluster.nodes import Node
from tests.cluster.servers import RedisServer

TOPIC, GROUP = "jobs", "workers"
#: the group's stream and its consumer group, as the Redis engine names them
STREAM = f"msgbroker:q:{len(GROUP)}:{GROUP}:{TOPIC}"


class Tally:
    """Who got which queue message (the reactor thread): payload -> members' identities,
    and Deferreds that fire once so many deliveries were counted."""

    def __init__(self) -> None:
        self.got: dict[bytes, list[str]] = defaultdict(list)
        self.count = 0
        self._waiters: list[tuple[int, defer.Deferred[None]]] = []

    def record(self, identity: str, payload: bytes) -> None:
        self.got[payload].append(identity)
        self.count += 1
        ready = [w for w in self._waiters if w[0] <= self.count]
        self._waiters = [w for w in self._waiters if w[0] > self.count]
        for _count, d in ready:
            d.callback(None)

    def when(self, count: int) -> defer.Deferred[None]:
        """Fires once ``count`` deliveries were counted (at once if they were)."""
        if self.count >= count:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append((count, d))
        return d

    def by_member(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for identities in self.got.values():
            for identity in identities:
                counts[identity] += 1
        return dict(counts)

    def duplicates(self) -> dict[bytes, list[str]]:
        return {payload: who for payload, who in self.got.items() if len(who) > 1}


class Member:
    """One queue group member: a Twisted MM2 client on ``node`` (its ``mm2`` listener, or
    ``address``) with ``batch-ack`` window ``window`` (``ack``: the ``ack`` extension, a
    window of 1); ``auto_ack=False``: the test acknowledges with :meth:`ack_all`."""

    def __init__(self, node: Node, identity: str, tally: Tally, *, window: int = 10,
                 ack: bool = False, auto_ack: bool = True, filters: tuple[str, ...] = (),
                 topic: str = TOPIC, group: str = GROUP,
                 address: tuple[str, int] | None = None) -> None:
        self.node = node
        self.identity = identity
        self.tally = tally
        self.held: list[Any] = []  # received, not acknowledged yet (auto_ack=False)
        #: when each message arrived (the reactor's clock): payload -> seconds
        self.arrived: dict[bytes, float] = {}
        host, port = address or node.address("mm2")
        self._barrier: defer.Deferred[None] | None = None
        reactor = node.thread.reactor

        def on_message(message: Any) -> None:
            if message.destination.startswith("@"):  # the barrier to itself
                if not auto_ack:
                    self.proto.ack(message)  # it takes room in the window too
                if self._barrier is not None:
                    d, self._barrier = self._barrier, None
                    d.callback(None)
                return
            self.arrived[message.payload] = reactor.seconds()
            tally.record(identity, message.payload)
            if not auto_ack:
                self.held.append(message)

        window_extension = "ack" if ack else f"batch-ack:max-count={window}"
        self.proto = node.call(
            connect, reactor, host, port, identity=identity,
            required=("pubsub", window_extension), optional=(),
            on_message=on_message, auto_ack=auto_ack,
        )  # fmt: skip
        self.subscribe(topic, group, filters)

    def subscribe(self, topic: str, group: str, filters: tuple[str, ...] = ()) -> None:
        """Subscribe and wait until it is in force on the node (a unicast to itself after
        it comes back: COMMAND frames have no reply)."""

        def go() -> defer.Deferred[None]:
            self.proto.subscribe(topic, queue=group, filters=list(filters))
            self._barrier = defer.Deferred()
            self.proto.unicast(self.identity, b"")
            return self._barrier

        self.node.call(go)

    def ack_all(self) -> None:
        def ack() -> None:
            held, self.held = self.held, []
            for message in held:
                self.proto.ack(message)

        self.node.call(ack)

    def drop(self) -> None:
        """The connection is cut (no goodbye): what it held unacknowledged is abandoned."""
        self.node.call(self.proto.transport.abortConnection)

    def close(self) -> None:
        def close() -> Any:
            if self.proto.transport is not None and self.proto.transport.connected:
                return self.proto.close()
            return None

        self.node.call(close)


def knows_group(node: Node, *members_on: Node, topic: str = TOPIC, group: str = GROUP) -> None:
    """Wait until ``node`` knows the group's members on each of ``members_on`` (its view, or
    its own groups)."""

    def known() -> bool:
        queues = node.cluster.queues
        remote = node.cluster.view.queues.get(topic, {}).get(group, {})
        for other in members_on:
            if other is node:
                if (topic, group) not in queues.groups:
                    return False
            elif other.name not in remote:
                return False
        return True

    node.until(known, f"{node.name} to know the group's members")


def pending(redis: Any, stream: str = STREAM, group: str = GROUP) -> int:
    """How many entries of the group's stream are taken and not acknowledged."""
    return int(redis.command("XPENDING", stream, group)[0])


def until_acknowledged(redis: RedisServer, what: str = "every entry acknowledged") -> None:
    """Until no entry of the group's stream is pending: looked at again after each XACK
    Redis runs (a node acknowledges without waiting for the reply)."""
    redis.until(lambda: pending(redis) == 0, what, after=("XACK",))
