"""Cost per publish on a topic with filtered subscriptions (issue 4: grows sub-linearly).

In process, on the hub alone: no sockets, so the figure is the routing cost (index lookups,
filter checks, grouping) without the writes. For 10, 100 and 1,000 subscriptions on one
topic it publishes messages that match one subscription (or a few), and reports µs per
publish through the hub's FilterIndex and, for comparison, checking every subscription.

    .venv/bin/python bench/filters.py [--publishes N] [--repeat R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from decimal import Decimal

from msgbroker.filters import Filter, matches_all
from msgbroker.hub import Hub
from msgbroker.message import Kind, Message


class Subscriber:
    """A hub peer that counts what it is sent."""

    protocol = "bench"

    def __init__(self, identity: str) -> None:
        self.identity: str | None = None
        self.subscriptions: dict = {}
        self.received = 0
        self._name = identity

    @staticmethod
    def encode(message: Message) -> bytes:
        return b"x"

    def send(self, frame: bytes) -> None:
        self.received += 1

    def kick(self, reason: str) -> None:
        pass


#: name -> (the filters of subscription i, the properties of publish j among n)
WORKLOADS: dict[str, tuple[Callable[[int], list[Filter]], Callable[[int, int], dict]]] = {
    "equality (user-id = N i; each publish matches 1)": (
        lambda i: [Filter("user-id", "=", i)],
        lambda j, n: {"user-id": j % n, "kind": "order"},
    ),
    "two filters (user-id = N i, kind = T order; matches 1)": (
        lambda i: [Filter("user-id", "=", i), Filter("kind", "=", "order")],
        lambda j, n: {"user-id": j % n, "kind": "order"},
    ),
    "text prefix (path < T/i/; matches 1)": (
        lambda i: [Filter("path", "<", f"/{i}/")],
        lambda j, n: {"path": f"/{j % n}/item/{j}"},
    ),
    "date bound (created > D t+i; matches 3)": (
        lambda i: [Filter("created", ">", Decimal(1_700_000_000 + i))],
        lambda j, n: {"created": Decimal(1_700_000_003)},
    ),
}


def measure(n: int, filters_of, properties_of, publishes: int, brute: bool) -> float:
    """µs per publish with ``n`` filtered subscribers (``brute``: check them all instead)."""
    hub = Hub()
    publisher = Subscriber("publisher")
    hub.login(publisher, "publisher")
    subs = []
    for i in range(n):
        sub = Subscriber(f"s{i}")
        hub.login(sub, f"s{i}")
        hub.subscribe(sub, "t", filters=filters_of(i))
        subs.append((sub, filters_of(i)))
    messages = [
        Message(Kind.MCAST, "publisher", "bench", "t", b"m", properties=properties_of(j, n))
        for j in range(publishes)
    ]
    if brute:
        start = time.perf_counter()
        for message in messages:
            for sub, filters in subs:
                if matches_all(filters, message.properties):
                    sub.send(b"x")
    else:
        multicast = hub.multicast
        start = time.perf_counter()
        for message in messages:
            multicast(publisher, message)
    return (time.perf_counter() - start) / publishes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; median")
    args = parser.parse_args()
    random.seed(1)
    sizes = (10, 100, 1000)
    print(f"µs per publish (median of {args.repeat}), {args.publishes} publishes per run")
    for name, (filters_of, properties_of) in WORKLOADS.items():
        print(f"\n{name}")
        for brute in (False, True):
            figures = [
                statistics.median(
                    measure(n, filters_of, properties_of, args.publishes, brute)
                    for _ in range(args.repeat)
                )
                for n in sizes
            ]
            label = "check every subscription" if brute else "hub (FilterIndex)"
            cells = "  ".join(f"{n:>5}: {f:7.2f}" for n, f in zip(sizes, figures, strict=True))
            print(f"  {label:26} {cells}   1000/10 = {figures[-1] / figures[0]:5.1f}x")


if __name__ == "__main__":
    main()
