"""Scenarios 20-23: the workloads real clients make (issue 16), where a broker that routes a
run of pipelined messages to one topic as a batch gets no runs.

- ``mcast16`` (20), ``fanout16`` (21): scenarios 1 and 2 with the publisher rotating over 16
  topics (``--topics 16`` for those two only), every subscriber on all 16.
- ``many`` (22): 100 publishers, 100 topics, 100 subscribers. Subscriber ``s`` subscribes to
  topic ``s`` alone; publisher ``p`` sends its ``j``-th message to topic ``(p + j) % 100``. So
  every message has one delivery (a 1 -> 1 workload, the issue's "1->1" target applies),
  no two consecutive messages on a connection share a topic, and every subscriber hears from
  every publisher: nothing arrives as a run, in or out. Subscribers on all 100 topics would
  make it a fan-out (100 deliveries per message), which ``fanout16`` already measures.
- ``rr100`` (23): 100 request/reply pairs at once, each keeping one request outstanding
  (closed loop): requester ``i`` sends a request to replier ``i`` and, when the reply comes,
  the next one. SSMP: ``UCAST rep005 <payload>``, answered ``UCAST req005 <payload>`` (each
  UCAST also gets its ``200``); MQTT: the requester publishes to the replier's topic
  ``rr/s005`` and waits for the reply on its own, ``rr/c005``. Figure: round trips per
  second in all, and each round trip's time (p50/p99). One pair's round trip, one at a
  time, is scenario 3 (``latency``; alias ``rr1``), with its requester and its echo in two
  processes as real peers are.

The 100 publishers of ``many`` are one forked process (``senders.MultiPublisher``); the 100
requesters and 100 repliers of ``rr100`` are the harness process itself, one epoll loop over
the 200 sockets (a process per side would add a context switch to every message on the
clients' core). Frames are all of one length per scenario (names and topics of fixed width),
so readers count bytes as in 1 and 2; ``many``'s streams interleave 100 publishers in an
order no one can predict, so its kept streams are checked after the clock stops by looking
every frame up: each must be expected, once, and each publisher's in its order.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import statistics
import time

import procs
from clients import (
    BenchError,
    close_all,
    open_many,
    receive_counts,
)
from procs import Server
from senders import MultiPublisher
from wire import MM2, MQTT, SSMP, payload

NAMES = ["mcast16", "fanout16", "many", "rr100"]
#: scenarios whose figure is a delivery rate (``publish_fanout``'s results)
THROUGHPUT = ["mcast16", "fanout16", "many"]
ALIASES = {"20": "mcast16", "21": "fanout16", "22": "many", "23": "rr100", "rr1": "latency"}
#: issue 16's targets, against Mosquitto in the same invocation
TARGETS = {
    ("mcast16", "ssmp"): 2.0, ("mcast16", "stmp"): 1.5, ("mcast16", "mm2"): 1.5,
    ("many", "ssmp"): 2.0, ("many", "stmp"): 1.5, ("many", "mm2"): 1.5,
    ("fanout16", "ssmp"): 10.0, ("fanout16", "stmp"): 10.0, ("fanout16", "mm2"): 10.0,
    ("rr100", "ssmp"): 1.5,
}
ROTATING_TOPICS = 16


def mcast16(server: Server, proto, params, around=None) -> dict:
    """20. 1 -> 1, the publisher rotating over 16 topics."""
    import scenarios  # not at the top: scenarios imports this module to register it

    return scenarios.publish_fanout(
        server, proto, params, messages=params.mcast_messages, subscribers=1, around=around,
        topics=ROTATING_TOPICS,
    )


def fanout16(server: Server, proto, params, around=None) -> dict:
    """21. 1 -> 100, the publisher rotating over 16 topics."""
    import scenarios

    return scenarios.publish_fanout(
        server, proto, params, messages=params.fanout_messages,
        subscribers=params.fanout_subscribers, around=around, topics=ROTATING_TOPICS,
    )


# -- 22: many publishers, many topics, many subscribers --------------------------------------


def many(server: Server, proto, params, around=None) -> dict:
    """22. ``many_clients`` publishers -> as many topics -> as many subscribers, one each."""
    import scenarios

    n = params.many_clients
    per = max(n, params.many_messages // n // n * n)  # per publisher, a multiple of n
    # message j of publisher p carries payload index p * stride + j: unique, and j's
    # Micromessage2 sequence number (index % 65535 + 1), which MM2.publish derives from it
    stride = 0xFFFF * math.ceil(per / 0xFFFF)
    if n * stride >= 100_000_000:
        raise BenchError(f"{per} messages per publisher: too many for 8-digit payload indexes")
    size = params.payload_size
    names = scenarios.topic_names(n)
    senders = [f"pub{p:03d}" for p in range(n)]
    port = server.port_for(proto.name)
    frame_len = len(proto.delivered(senders[0], names[0], payload(0, size)))
    datas = [
        b"".join(proto.publish(names[(p + j) % n], payload(p * stride + j, size))
                 for j in range(per))
        for p in range(n)
    ]
    keep = min(n, params.verify_streams) if params.verify else 0
    check = _stream_checker(proto, n, per, stride, size, names, senders, frame_len, keep)
    socks: list[socket.socket] = []
    pub_socks: list[socket.socket] = []
    try:
        socks = open_many(port, [proto.subscriber_setup(f"sub{s:03d}", names[s])
                                 for s in range(n)], timeout=60.0)
        for sock in socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pub_socks = open_many(port, [proto.publisher_setup(sender) for sender in senders],
                              timeout=60.0)
        for sock in pub_socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        measure = scenarios.Measurement(server)
        deadline = time.monotonic() + params.scenario_timeout
        with around() if around else contextlib.nullcontext():
            publisher = MultiPublisher(pub_socks, datas, [per * len(proto.publish_reply)] * n,
                                       params.scenario_timeout)
            pub_socks = []  # the child has them (and closed ours)
            try:
                got = receive_counts(
                    socks, per * frame_len, last_frame=None, idle_timeout=params.idle_timeout,
                    deadline=deadline, verify_streams=keep, check_stream=check,
                    on_first=measure.first_byte,
                )
                measure.last_byte()
            finally:
                pub = publisher.finish()
        result = measure.figures(
            got, messages=per, subscribers=n, frame_len=frame_len, pub=pub,
            verified=(f"every frame of {keep} streams (each expected, once, each publisher's "
                      "in order), the byte count of the others") if keep else "byte counts",
        )
        result.update(publishers=n, topics=n, messages_per_publisher=per,
                      rss_after_kib=server.rss_kib())
        if "elapsed_s" in result:
            result["msgs_per_s"] = result["deliveries_per_s"]
        if pub.get("error"):
            raise BenchError(f"publishers: {pub['error']}")
        return result
    finally:
        close_all(socks)
        close_all(pub_socks)


def _stream_checker(proto, n, per, stride, size, names, senders, frame_len, keep):
    """``check_stream`` for ``many``: subscriber ``s``'s stream must hold exactly the frames
    sent to topic ``s``, each once, each publisher's in the order it sent them. A delivery's
    Micromessage2 sequence number is the subscriber's own count (arrival order, unknown in
    advance): it is masked out before the lookup."""
    if not keep:
        return None
    unsequenced = MM2.unsequenced if isinstance(proto, MM2) else bytes
    expected: dict[int, dict[bytes, tuple[int, int]]] = {}
    for s in range(keep):
        frames = {}
        for p in range(n):
            for j in range((s - p) % n, per, n):  # publisher p's messages to topic s
                frame = proto.delivered(senders[p], names[s], payload(p * stride + j, size))
                frames[unsequenced(frame)] = (p, j)
        expected[s] = frames

    def check(s: int, data: bytearray) -> str | None:
        frames = expected[s]
        last = [-1] * n
        seen: set[bytes] = set()
        for pos in range(0, len(data), frame_len):
            frame = unsequenced(bytes(data[pos : pos + frame_len]))
            where = frames.get(frame)
            if where is None:
                return f"frame {pos // frame_len} not expected: {frame[:60]!r}"
            if frame in seen:
                return f"frame {pos // frame_len} twice: {frame[:60]!r}"
            seen.add(frame)
            p, j = where
            if j < last[p]:
                return f"publisher {p}'s message {j} after its message {last[p]}"
            last[p] = j
        if len(seen) != len(frames):
            return f"{len(seen)} frames, expected {len(frames)}"
        return None

    return check


# -- 23: request/reply pairs ---------------------------------------------------------------


class _Frames:
    """One pair's frames, all ``prefix + payload + suffix`` with a fixed prefix and suffix
    (taken from a sample frame): the request, what the replier receives, its reply, what
    the requester receives; and the per-message acknowledgement each sender gets (SSMP
    ``200``; none in MQTT)."""

    def __init__(self, proto, i: int, size: int) -> None:
        sample = payload(0, size)

        def split(frame: bytes) -> tuple[bytes, bytes]:
            at = frame.index(sample)
            return frame[:at], frame[at + size :]

        req, rep = f"req{i:03d}", f"rep{i:03d}"
        if isinstance(proto, SSMP):
            self.request = split(proto.ucast(rep, sample))
            self.delivered = split(proto.ucast_event(req, rep, sample))
            self.reply = split(proto.ucast(req, sample))
            self.answer = split(proto.ucast_event(rep, req, sample))
            self.ack = proto.publish_reply
            self.setups = (proto.publisher_setup(req), proto.publisher_setup(rep))
        else:
            assert isinstance(proto, MQTT)
            mine, theirs = f"rr/c{i:03d}", f"rr/s{i:03d}"
            self.request = self.delivered = split(proto.publish(theirs, sample))
            self.reply = self.answer = split(proto.publish(mine, sample))
            self.ack = b""
            self.setups = (proto.subscriber_setup(req, mine), proto.subscriber_setup(rep, theirs))
        # the requester gets its request's ack, then the answer; the replier the request,
        # then (after it replied) its reply's ack
        self.requester_gets = len(self.ack) + sum(map(len, self.answer)) + size
        self.delivered_len = sum(map(len, self.delivered)) + size
        self.replier_gets = self.delivered_len + len(self.ack)


def request_reply(server: Server, proto, params, around=None) -> dict:
    """23. ``rr_pairs`` request/reply pairs at once, one request outstanding in each, until
    ``rr_round_trips`` round trips in all; the first ``rr_warmup`` are not counted."""
    from scenarios import percentile

    pairs = params.rr_pairs
    size = params.payload_size
    total = params.rr_round_trips + params.rr_warmup
    frames = [_Frames(proto, i, size) for i in range(pairs)]
    socks: list[socket.socket] = []
    try:
        socks = open_many(server.port, [s for f in frames for s in f.setups], timeout=60.0)
        for sock in socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        with around() if around else contextlib.nullcontext():
            loop = _RequestReply(socks, frames, size, total, params.rr_warmup, server)
            loop.run(time.monotonic() + params.scenario_timeout, params.idle_timeout)
    finally:
        close_all(socks)
    samples = sorted(loop.samples)
    if loop.wrong:
        raise BenchError(f"{loop.wrong} wrong answers; first: {loop.first_wrong}")
    if not samples or loop.done < total:
        raise BenchError(f"only {loop.done} of {total} round trips in "
                         f"{params.scenario_timeout:.0f} s")
    wall = loop.t_end - loop.t_start
    run_ns = loop.server_end[0] - loop.server_start[0]
    wait_ns = loop.server_end[1] - loop.server_start[1]
    client_run = loop.client_end[0] - loop.client_start[0]
    client_wait = loop.client_end[1] - loop.client_start[1]
    return {
        "pairs": pairs,
        "round_trips": len(samples),
        "warmup": params.rr_warmup,
        "elapsed_s": wall,
        "round_trips_per_s": len(samples) / wall,
        "p50_us": percentile(samples, 50) / 1000,
        "p90_us": percentile(samples, 90) / 1000,
        "p99_us": percentile(samples, 99) / 1000,
        "max_us": samples[-1] / 1000,
        "server_busy": run_ns / 1e9 / wall,
        "server_runq": wait_ns / 1e9 / wall,
        "server_window_s": wall,
        "server_cpu_per_round_trip_us": run_ns / 1000 / len(samples),
        "client_cpu_share": client_run / 1e9 / wall,
        # ready to run but its core busy with something else
        "client_runq_share": client_wait / 1e9 / wall,
        "reads": loop.reads,
    }


class _Side:
    """One socket of a pair: what it reads into, how much it has, how much makes a unit."""

    __slots__ = ("buf", "busy", "frames", "have", "pair", "sent", "sock", "t0", "view", "want")

    def __init__(self, pair: int, sock: socket.socket, frames: _Frames, want: int) -> None:
        self.pair, self.sock, self.frames, self.want = pair, sock, frames, want
        self.buf = bytearray(want)
        self.view = memoryview(self.buf)
        self.have = 0
        self.busy = False  # replier: replied, waiting for its reply's ack
        self.sent = b""  # requester: what it expects back for the request in flight
        self.t0 = 0


class _RequestReply:
    """The requesters and the repliers of every pair, in one epoll loop."""

    def __init__(self, socks, frames, size, total, warmup, server) -> None:
        self.size = size
        self.total = total
        self.warmup = warmup
        self.server = server
        self.issued = self.done = self.wrong = self.reads = 0
        self.first_wrong: str | None = None
        self.samples: list[int] = []
        self.requesters: dict[int, _Side] = {}
        self.repliers: dict[int, _Side] = {}
        for i, f in enumerate(frames):
            requester, replier = socks[2 * i], socks[2 * i + 1]
            self.requesters[requester.fileno()] = _Side(i, requester, f, f.requester_gets)
            self.repliers[replier.fileno()] = _Side(i, replier, f, f.replier_gets)
        self.t_start = self.t_end = 0.0
        self.server_start = self.server_end = (0, 0)
        self.client_start = self.client_end = (0, 0)

    def _send_request(self, side: _Side) -> None:
        body = payload(self.issued, self.size)
        self.issued += 1
        prefix, suffix = side.frames.request
        answer_prefix, answer_suffix = side.frames.answer
        side.sent = side.frames.ack + answer_prefix + body + answer_suffix
        side.t0 = time.perf_counter_ns()
        side.sock.send(prefix + body + suffix)

    def run(self, deadline: float, idle_timeout: float) -> None:
        ep = select.epoll()
        try:
            for fd in (*self.requesters, *self.repliers):
                ep.register(fd, select.EPOLLIN)
            for side in self.requesters.values():
                if self.issued < self.total:
                    self._send_request(side)
            if self.warmup == 0:
                self._open_window()
            last_data = time.monotonic()
            requesters, repliers = self.requesters, self.repliers
            while self.done < self.total:
                events = ep.poll(0.1)
                now = time.monotonic()
                if not events:
                    if now - last_data > idle_timeout or now > deadline:
                        return
                    continue
                last_data = now
                for fd, _ in events:
                    side = requesters.get(fd)
                    if side is not None:
                        self._requester_readable(side)
                    else:
                        self._replier_readable(repliers[fd])
            self.t_end = time.perf_counter()
            self.server_end = self.server.sched_ns()
            self.client_end = procs.sched_ns(os.getpid())
        finally:
            ep.close()

    def _open_window(self) -> None:
        self.t_start = time.perf_counter()
        self.server_start = self.server.sched_ns()
        self.client_start = procs.sched_ns(os.getpid())

    def _read(self, side: _Side) -> bool:
        """Read what there is, up to the unit; False when nothing was there."""
        try:
            n = side.sock.recv_into(side.view[side.have : side.want])
        except BlockingIOError:
            return False
        if n == 0:
            raise BenchError(f"the server closed a connection of pair {side.pair}")
        self.reads += 1
        side.have += n
        return True

    def _requester_readable(self, side: _Side) -> None:
        # its request's ack (SSMP), then the answer
        if not self._read(side) or side.have < side.want:
            return
        t1 = time.perf_counter_ns()
        if side.buf != side.sent:
            self._wrong(f"pair {side.pair}'s answer {bytes(side.buf)[:80]!r}")
        side.have = 0
        self.done += 1
        if self.done > self.warmup:
            self.samples.append(t1 - side.t0)
        elif self.done == self.warmup:
            self._open_window()
        if self.issued < self.total:
            self._send_request(side)

    def _replier_readable(self, side: _Side) -> None:
        # the request, then (once it replied) its reply's ack (SSMP)
        if not self._read(side):
            return
        f = side.frames
        if not side.busy and side.have >= f.delivered_len:
            prefix, suffix = f.delivered
            end = len(prefix) + self.size
            buf = side.buf
            if buf[: len(prefix)] != prefix or buf[end : f.delivered_len] != suffix:
                self._wrong(f"pair {side.pair}'s request {bytes(buf[: f.delivered_len])[:80]!r}")
            reply_prefix, reply_suffix = f.reply
            side.sock.send(reply_prefix + buf[len(prefix) : end] + reply_suffix)
            side.busy = True
        if side.busy and side.have == side.want:
            if side.buf[f.delivered_len :] != f.ack:
                got = bytes(side.buf[f.delivered_len :])
                self._wrong(f"pair {side.pair}'s replier got {got!r}")
            side.have = 0
            side.busy = False

    def _wrong(self, what: str) -> None:
        self.wrong += 1
        if self.first_wrong is None:
            self.first_wrong = what


SCENARIOS = {
    "mcast16": (20, "1->1, the publisher rotating over 16 topics", mcast16),
    "fanout16": (21, "fan-out 1->100, the publisher rotating over 16 topics", fanout16),
    "many": (22, "100 publishers -> 100 topics -> 100 subscribers (one topic each)", many),
    "rr100": (23, "request/reply: 100 pairs at once, one request outstanding each",
              request_reply),
}
KINDS = {
    "mcast16": ["ssmp", "stmp", "mm2", "mosquitto"],
    "fanout16": ["ssmp", "stmp", "mm2", "mosquitto"],
    "many": ["ssmp", "stmp", "mm2", "mosquitto"],
    "rr100": ["ssmp", "mosquitto"],  # STMP and MM2: no request/reply clients in the harness
}
#: "from the publisher's start" too: msgbroker reads every ready connection's chunk of
#: publishes in one reactor turn before its writes go out, so with 100 publishers (or a 64
#: KiB chunk of 16-topic fan-out) the first delivery comes late and "first byte to last
#: byte" leaves much of the work out (quick run of ``many``: 0.001 s for 20,000 messages)
SUMMARY = {
    "mcast16": [("deliveries_per_s", "msgs/s", True),
                ("deliveries_per_s_from_start", "msgs/s from the publisher's start", True)],
    "fanout16": [("deliveries_per_s", "deliveries/s", True),
                 ("deliveries_per_s_from_start", "deliveries/s from the publisher's start",
                  True)],
    "many": [("deliveries_per_s_from_start", "msgs/s from the publishers' start (one delivery "
              "each)", True),
             ("deliveries_per_s", "msgs/s first byte to last (overstated, see above)", True)],
    "rr100": [("round_trips_per_s", "round trips/s", True), ("p50_us", "p50 us", False),
              ("p99_us", "p99 us", False)],
}


def describe(name: str, r: dict) -> str:
    """rr100's line (the others are described as scenarios 1 and 2 are)."""
    return (f"{r['round_trips_per_s']:,.0f} round trips/s over {r['pairs']} pairs "
            f"({r['round_trips']:,} in {r['elapsed_s']:.2f} s); round trip p50 "
            f"{r['p50_us']:.1f} us, p90 {r['p90_us']:.1f} us, p99 {r['p99_us']:.1f} us, max "
            f"{r['max_us']:.1f} us; server CPU {r['server_cpu_per_round_trip_us']:.2f} us per "
            f"round trip; clients (one process) {100 * r['client_cpu_share']:.0f}% of a core, "
            f"{100 * r['client_runq_share']:.0f}% waiting for it")


def ratios(name: str, key: str, by_kind: dict) -> str:
    """Each protocol against Mosquitto, with issue 16's target where there is one."""
    theirs = _median(by_kind.get("mosquitto", []), key)
    if not theirs:
        return ""
    text = ""
    for kind, runs in by_kind.items():
        ours = _median(runs, key)
        if kind == "mosquitto" or ours is None:
            continue
        ratio = ours / theirs
        text += f"; {kind}/mosquitto {ratio:.2f}x"
        rates = ("deliveries_per_s", "deliveries_per_s_from_start", "round_trips_per_s")
        target = TARGETS.get((name, kind)) if key in rates else None
        if target:
            text += f" (target >= {target}x: {'met' if ratio >= target else 'NOT met'})"
    return text


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None
