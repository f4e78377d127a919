"""The client side of bench/engine_clients.py: one publisher or one subscriber process on a
candidate client library, started by the harness (see bench/README.md, "Engine client
libraries").

    python engine_roles.py pub|sub VARIANT --port P [--count N] [--batch K] [--window W] ...

Variants (Redis: a, b, c; NATS: d, e; the -asyncio ones for comparison only):

    hiredis           (a) a Twisted protocol, hiredis.Reader parses RESP, hiredis.pack_command
    txredisapi        (b) txredisapi (its hiredis protocol when hiredis is installed), pipeline()
    redispy           (c) redis-py's asyncio client on Twisted's asyncioreactor
    redispy-asyncio       the same on a plain asyncio loop (no Twisted)
    natspy            (d) nats-py on Twisted's asyncioreactor
    natspy-asyncio        the same on a plain asyncio loop
    twisted-nats      (e) a minimal Twisted NATS protocol (CONNECT/PUB/SUB/MSG/PING/PONG)

The publisher sends ``count`` messages of ``min-size``..``max-size`` bytes (sizes drawn from a
seeded generator, the message number in the first 8 bytes) to one channel in batches of
``batch``, each batch one write, and waits for a batch's confirmation (Redis: its PUBLISH
replies; NATS: a PONG after the batch) with at most ``window`` batches unconfirmed (nats-py:
``flush()``, a PING/PONG round trip, after every ``window``-th batch; txredisapi and redis-py:
always 1, their pipelines await the replies). The subscriber prints ``ready`` once
its subscription is confirmed, counts messages and bytes, and ends at the ``count``-th.

Each prints one JSON line: its CPU time (time.process_time) over the measured span, the span's
ends (time.monotonic, comparable across processes) and, given ``--server-pid``, the server's
CPU seconds read at those ends (publisher: at its start; subscriber: at its last message).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REDIS_VARIANTS = ("hiredis", "txredisapi", "redispy", "redispy-asyncio")
NATS_VARIANTS = ("natspy", "natspy-asyncio", "twisted-nats")
ASYNCIO_REACTOR = ("redispy", "natspy")
PLAIN_ASYNCIO = ("redispy-asyncio", "natspy-asyncio")
_TICK = os.sysconf("SC_CLK_TCK")


def payloads(count: int, seed: int, low: int, high: int) -> list[bytes]:
    """The messages: sizes uniform in [low, high], numbered in their first 8 bytes."""
    rng = random.Random(seed)
    filler = bytes(range(97, 123)) * (high // 26 + 1)  # a-z, repeated
    return [b"%08d" % i + filler[: rng.randint(low, high) - 8] for i in range(count)]


def server_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Span:
    """The measured part of a role: CPU and wall clock at its two ends."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.result: dict[str, Any] = {}

    def begin(self) -> None:
        self.result.update(
            t0=time.monotonic(), cpu0=time.process_time(), server_cpu0=server_cpu(self.server_pid)
        )

    def end(self, **extra: Any) -> None:
        self.result.update(
            t1=time.monotonic(), cpu1=time.process_time(), server_cpu1=server_cpu(self.server_pid),
            **extra,
        )


class Tally:
    """What a subscriber received; ``done`` is called once at the ``count``-th message."""

    def __init__(self, count: int, span: Span, done: Callable[[], None]) -> None:
        self.count = count
        self.received = 0
        self.bytes = 0
        self.last = b""
        self.span = span
        self._done = done

    def add(self, payload: bytes) -> None:
        self.received += 1
        self.bytes += len(payload)
        if self.received == self.count:
            self.last = payload[:8]
            self.span.end(received=self.received, bytes=self.bytes, last=self.last.decode())
            self._done()


def ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def batches(messages: list[bytes], size: int) -> list[list[bytes]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


# -- (a) hiredis in a Twisted protocol; (e) a minimal Twisted NATS protocol


def twisted_roles(args: argparse.Namespace, span: Span, messages: list[bytes]) -> None:
    from twisted.internet import epollreactor

    epollreactor.install()
    from twisted.internet import protocol, reactor

    if args.variant == "hiredis":
        import hiredis

    channel = args.channel.encode()
    groups = batches(messages, args.batch)

    class Windowed(protocol.Protocol):
        """Sends batches while fewer than ``window`` are unconfirmed; ``confirm`` is
        called once per confirmation unit (a PUBLISH reply, a PONG)."""

        per_batch = 1

        def start(self) -> None:
            self.next = 0
            self.outstanding = 0  # confirmation units still expected
            span.begin()
            self.fill()

        def fill(self) -> None:
            while self.next < len(groups) and self.outstanding < args.window * self.per_batch:
                group = groups[self.next]
                self.next += 1
                self.transport.write(self.encode(group))
                self.outstanding += self.units(group)

        def confirm(self, units: int) -> None:
            self.outstanding -= units
            if self.next < len(groups):
                self.fill()
            elif self.outstanding == 0:
                span.end(sent=len(messages))
                reactor.stop()

    class RedisPublisher(Windowed):
        per_batch = args.batch  # one reply per PUBLISH

        def connectionMade(self) -> None:
            self.reader = hiredis.Reader()
            self.start()

        def encode(self, group: list[bytes]) -> bytes:
            pack = hiredis.pack_command
            return b"".join([pack((b"PUBLISH", channel, m)) for m in group])

        def units(self, group: list[bytes]) -> int:
            return len(group)

        def dataReceived(self, data: bytes) -> None:
            reader = self.reader
            reader.feed(data)
            replies = 0
            while reader.gets() is not False:
                replies += 1
            self.confirm(replies)

    class RedisSubscriber(protocol.Protocol):
        def connectionMade(self) -> None:
            self.reader = hiredis.Reader()
            self.tally = Tally(args.count, span, reactor.stop)
            self.transport.write(hiredis.pack_command((b"SUBSCRIBE", channel)))

        def dataReceived(self, data: bytes) -> None:
            reader = self.reader
            reader.feed(data)
            add = self.tally.add
            while (reply := reader.gets()) is not False:
                if reply[0] == b"message":
                    add(reply[2])
                elif reply[0] == b"subscribe":
                    span.begin()
                    ready()

    class NatsLines(protocol.Protocol):
        """The NATS text protocol: control lines, and MSG payloads of a given length."""

        def connectionMade(self) -> None:
            self.buffer = b""

        def dataReceived(self, data: bytes) -> None:
            buffer = self.buffer + data if self.buffer else data
            at = 0
            size = len(buffer)
            while at < size:
                eol = buffer.find(b"\r\n", at)
                if eol < 0:
                    break
                if buffer.startswith(b"MSG ", at):
                    length = int(buffer[buffer.rfind(b" ", at, eol) + 1 : eol])
                    end = eol + 2 + length
                    if end + 2 > size:
                        break
                    self.message(buffer[eol + 2 : end])
                    at = end + 2
                    continue
                self.line(buffer[at:eol])
                at = eol + 2
            self.buffer = buffer[at:]

        def line(self, line: bytes) -> None:
            if line == b"PING":
                self.transport.write(b"PONG\r\n")
            elif line == b"PONG":
                self.pong()
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())
            elif line.startswith(b"INFO "):
                self.info()

        def message(self, payload: bytes) -> None:
            raise NotImplementedError

    connect = b'CONNECT {"verbose":false,"pedantic":false,"name":"bench"}\r\n'
    subject = channel

    class NatsPublisher(NatsLines, Windowed):
        def info(self) -> None:
            self.transport.write(connect)
            self.start()

        def encode(self, group: list[bytes]) -> bytes:
            head = b"PUB " + subject + b" "
            return b"".join([b"%s%d\r\n%s\r\n" % (head, len(m), m) for m in group]) + b"PING\r\n"

        def units(self, group: list[bytes]) -> int:
            return 1

        def pong(self) -> None:
            self.confirm(1)

    class NatsSubscriber(NatsLines):
        def info(self) -> None:
            self.tally = Tally(args.count, span, reactor.stop)
            self.transport.write(connect + b"SUB " + subject + b" 1\r\nPING\r\n")

        def pong(self) -> None:
            span.begin()
            ready()

        def message(self, payload: bytes) -> None:
            self.tally.add(payload)

    roles = {
        ("hiredis", "pub"): RedisPublisher, ("hiredis", "sub"): RedisSubscriber,
        ("twisted-nats", "pub"): NatsPublisher, ("twisted-nats", "sub"): NatsSubscriber,
    }
    factory = protocol.ClientFactory.forProtocol(roles[args.variant, args.role])
    reactor.connectTCP(args.host, args.port, factory)
    reactor.run()


# -- (b) txredisapi


def txredisapi_role(args: argparse.Namespace, span: Span, messages: list[bytes]) -> None:
    from twisted.internet import epollreactor

    epollreactor.install()
    import txredisapi
    from twisted.internet import defer, reactor
    from twisted.internet.endpoints import TCP4ClientEndpoint

    failures: list[Any] = []

    def fail(failure: Any) -> None:
        failures.append(failure)
        reactor.stop()

    if args.role == "pub":

        @defer.inlineCallbacks
        def publish() -> Any:
            # the engine's settings: binary payloads, no number or charset conversion
            conn = yield txredisapi.Connection(
                args.host, args.port, reconnect=False, charset=None, convertNumbers=False
            )
            span.begin()
            # its pipelining: the batch's commands in one write, then all their replies
            # (a pipeline holds the connection: one batch unconfirmed at a time; plain
            # publish() calls cost twice the CPU through its connection handler)
            for group in batches(messages, args.batch):
                pipe = yield conn.pipeline()
                for message in group:
                    pipe.publish(args.channel, message)
                yield pipe.execute_pipeline()
            span.end(sent=len(messages))
            yield conn.disconnect()
            reactor.stop()

        reactor.callWhenRunning(lambda: publish().addErrback(fail))
    else:

        class Subscriber(txredisapi.SubscriberProtocol):
            def connectionMade(self) -> None:
                self.tally = Tally(args.count, span, reactor.stop)
                self.add = self.tally.add
                super().connectionMade()
                self.subscribe(args.channel).addCallbacks(self.subscribed, fail)

            def subscribed(self, _reply: Any) -> None:
                span.begin()
                ready()

            def messageReceived(self, pattern: Any, channel: Any, message: bytes) -> None:
                self.add(message)

        factory = txredisapi.SubscriberFactory()
        factory.protocol = Subscriber
        factory.charset = None
        factory.convertNumbers = False
        factory.reconnect = False
        # the one way txredisapi connects its factories
        factory.startConnecting(TCP4ClientEndpoint(reactor, args.host, args.port))
    reactor.run()
    if failures:
        failures[0].raiseException()


# -- (c) redis-py asyncio; (d) nats-py


async def redispy_role(args: argparse.Namespace, span: Span, messages: list[bytes]) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis(host=args.host, port=args.port)
    try:
        if args.role == "pub":
            span.begin()
            for group in batches(messages, args.batch):
                pipe = client.pipeline(transaction=False)
                for message in group:
                    pipe.publish(args.channel, message)
                await pipe.execute()
            span.end(sent=len(messages))
        else:
            done = asyncio.Event()
            tally = Tally(args.count, span, done.set)
            pubsub = client.pubsub()
            await pubsub.subscribe(args.channel)
            # "ready" once Redis has confirmed the subscription
            while True:
                reply = await pubsub.get_message(timeout=5.0)
                if reply is not None and reply["type"] == "subscribe":
                    break
            span.begin()
            ready()
            add = tally.add
            async for message in pubsub.listen():
                if message["type"] == "message":
                    add(message["data"])
                    if done.is_set():
                        break
            await pubsub.aclose()
    finally:
        await client.aclose()


async def natspy_role(args: argparse.Namespace, span: Span, messages: list[bytes]) -> None:
    import nats

    nc = await nats.connect(f"nats://{args.host}:{args.port}", allow_reconnect=False)
    try:
        if args.role == "pub":
            span.begin()
            for number, group in enumerate(batches(messages, args.batch), 1):
                for message in group:
                    await nc.publish(args.channel, message)
                # flush: write what is pending, then PING and wait for the PONG
                if number % args.window == 0:
                    await nc.flush()
                else:
                    # publish() queued the batch and woke nats-py's flusher task: this turn
                    # of the loop lets it write the batch (one write), without a round trip
                    await asyncio.sleep(0)
            await nc.flush()
            span.end(sent=len(messages))
        else:
            done = asyncio.Event()
            tally = Tally(args.count, span, done.set)
            add = tally.add

            async def on_message(message: Any) -> None:
                add(message.data)

            await nc.subscribe(
                args.channel, cb=on_message,
                pending_msgs_limit=10 * args.count, pending_bytes_limit=1 << 31,
            )
            await nc.flush()
            span.begin()
            ready()
            await done.wait()
    finally:
        await nc.close()


def asyncio_role(args: argparse.Namespace, span: Span, messages: list[bytes]) -> None:
    role = redispy_role if args.variant.startswith("redispy") else natspy_role
    if args.variant in PLAIN_ASYNCIO:
        asyncio.run(role(args, span, messages))
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from twisted.internet import asyncioreactor

    asyncioreactor.install(loop)
    from twisted.internet import defer, reactor

    failures: list[Any] = []

    def run() -> None:
        done = defer.Deferred.fromFuture(loop.create_task(role(args, span, messages)))
        done.addErrback(failures.append)
        done.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(run)
    reactor.run()
    if failures:
        failures[0].raiseException()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("pub", "sub"))
    p.add_argument("variant", choices=(*REDIS_VARIANTS, *NATS_VARIANTS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--channel", default="bench.engine")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--min-size", type=int, default=64)
    p.add_argument("--max-size", type=int, default=200)
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--server-pid", type=int)
    args = p.parse_args(argv)
    messages = []
    if args.role == "pub":
        messages = payloads(args.count, args.seed, args.min_size, args.max_size)
    span = Span(args.server_pid)
    if args.variant in ("hiredis", "twisted-nats"):
        twisted_roles(args, span, messages)
    elif args.variant == "txredisapi":
        txredisapi_role(args, span, messages)
    else:
        asyncio_role(args, span, messages)
    if "t1" not in span.result:
        print(json.dumps({"error": "ended before its span did"}))
        return 1
    print(json.dumps(span.result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
