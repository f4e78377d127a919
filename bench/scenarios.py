"""The scenarios. Each takes a running server and its wire protocol and returns a dict of
figures; none of them knows which server it drives. The STMP ones (stmp-mcast, stmp-fanout,
stmp-cross) are scenarios 1 and 2 with their own counts, driven with the STMP wire protocol
(and Mosquitto/SSMP at the same counts for the ratios), and a fan-out whose publisher speaks
SSMP or STMP to STMP subscribers. The Micromessage2 ones (mm2-mcast, mm2-ack, mm2-fanout)
are the same with the MM2 wire protocol; mm2-ack turns on batch-ack (a window of 100) on the
publisher and the subscriber, so the publisher is windowed and the subscriber acknowledges
what it reads."""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import socket
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass

import idle as idle_scenario
from clients import (
    BenchError,
    Received,
    close_all,
    cumulative_acker,
    open_client,
    open_many,
    open_spread,
    receive_counts,
    tcp_state,
)
from procs import Server, core_busy, core_times, tcp_send_queue
from senders import Echo, Publisher, WindowedPublisher
from wire import MM2, MQTT, SSMP, payload

TOPIC = "bench"


@dataclass
class Params:
    mcast_messages: int = 200_000
    fanout_messages: int = 20_000
    fanout_subscribers: int = 100
    stalled_messages: int = 20_000
    latency_round_trips: int = 5_000
    latency_warmup: int = 200
    idle_connections: int = 10_000
    #: scenario 5: logins in progress at once (each answered before the next is sent)
    idle_window: int = 100
    payload_size: int = 64
    idle_timeout: float = 15.0  # no byte for this long: give up on a stream
    scenario_timeout: float = 300.0
    #: compare every delivered byte with the expected stream (after the clock stops) for
    #: this many subscribers, and the last frame for the others
    verify: bool = True
    verify_streams: int = 10
    #: topics the publisher cycles through (all subscribed by every subscriber)
    topics: int = 1
    #: STMP scenarios: 1->1 long enough to take a second at Mosquitto's rate and more
    stmp_mcast_messages: int = 300_000
    stmp_fanout_messages: int = 10_000
    #: enough deliveries that the server's CPU time (10 ms ticks) is known to a few %
    cross_messages: int = 200_000
    cross_subscribers: int = 10
    #: Micromessage2 scenarios: 1->1 without and with acks (batch-ack window), fan-out
    mm2_mcast_messages: int = 300_000
    mm2_ack_messages: int = 300_000
    mm2_ack_window: int = 100
    mm2_fanout_messages: int = 10_000
    #: sbus scenarios (bench/sbus.py): 1->1 at 16 B, 64 B and 1 KiB; 1->10 fan-out, also
    #: with a stalled subscriber, and the broker's --max-backlog for its bounded runs
    sbus_mcast_messages: int = 300_000
    sbus_fanout_messages: int = 100_000
    sbus_subscribers: int = 10
    sbus_bound: int = 1 << 20
    #: packets per system call in the sbus clients (recvmmsg/sendmmsg above 1)
    sbus_batch: int = 1
    #: bench/mixed.py: 22 (many publishers, topics and subscribers; messages in all) and
    #: 23 (request/reply pairs; round trips in all, after the warm-up ones)
    many_clients: int = 100
    many_messages: int = 200_000
    rr_pairs: int = 100
    rr_round_trips: int = 100_000
    rr_warmup: int = 5_000

    def quick(self) -> Params:
        return Params(
            mcast_messages=20_000, fanout_messages=2_000, fanout_subscribers=100,
            stalled_messages=2_000,
            latency_round_trips=500, latency_warmup=50, idle_connections=1_000,
            idle_window=self.idle_window,
            payload_size=self.payload_size, idle_timeout=self.idle_timeout,
            scenario_timeout=self.scenario_timeout, verify=self.verify, topics=self.topics,
            stmp_mcast_messages=30_000, stmp_fanout_messages=1_000, cross_messages=20_000,
            cross_subscribers=self.cross_subscribers,
            mm2_mcast_messages=30_000, mm2_ack_messages=30_000,
            mm2_ack_window=self.mm2_ack_window, mm2_fanout_messages=1_000,
            sbus_mcast_messages=30_000, sbus_fanout_messages=10_000,
            sbus_subscribers=self.sbus_subscribers, sbus_bound=self.sbus_bound // 4,
            many_clients=self.many_clients, many_messages=20_000, rr_pairs=self.rr_pairs,
            rr_round_trips=10_000, rr_warmup=1_000,
        )


class Measurement:
    """What a throughput run measures besides its rate: the server's CPU over the
    publisher's lifetime (from now to :meth:`figures`), the harness's own (the readers'),
    each core's busy time, and the server's time on its core and waiting for it over the
    measured window alone (:meth:`first_byte` to :meth:`last_byte`, from schedstat)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss_before = server.rss_kib()
        self.server_cpu = server.cpu_seconds()
        self.cores = core_times()
        self.own = os.times()
        self.start = time.perf_counter()
        self._window: tuple[float, int, int] | None = None
        self._members: dict[str, tuple[int, int]] | None = None
        self.window: dict = {}

    def first_byte(self) -> None:
        """``receive_counts``' ``on_first``: the measured window opens."""
        self._window = (time.perf_counter(), *self.server.sched_ns())
        # a server made of several processes (cluster nodes, their engine server) may
        # name them: each one's busy share over the window is reported too
        members = getattr(self.server, "member_sched_ns", None)
        self._members = members() if members is not None else None

    def last_byte(self) -> None:
        """Right after the readers are done: the measured window closes."""
        if self._window is None:
            return
        t0, run0, wait0 = self._window
        run1, wait1 = self.server.sched_ns()
        wall = time.perf_counter() - t0
        if wall > 0:
            # busy: on its core; runq: ready to run, its core busy with something else;
            # the rest idle (waiting for input: the clients set the pace)
            self.window = {"server_busy": (run1 - run0) / 1e9 / wall,
                           "server_runq": (wait1 - wait0) / 1e9 / wall,
                           "server_window_s": wall}
            if self._members is not None:
                self.window["members_busy"] = members_busy(
                    self._members, self.server.member_sched_ns(), wall)

    def figures(self, got: Received, *, messages: int, subscribers: int, frame_len: int,
                pub: dict, verified: str) -> dict:
        """The result of a run in which ``subscribers`` readers each expected ``messages``
        frames of ``frame_len`` bytes (``pub``: the publisher's report)."""
        wall = time.perf_counter() - self.start
        server_cpu = self.server.cpu_seconds() - self.server_cpu
        cores = core_busy(self.cores, core_times())
        after = os.times()
        reader_cpu = after.user + after.system - self.own.user - self.own.system
        pub_cpu = pub.get("cpu_seconds", 0.0)
        result: dict = {
            "messages": messages,
            "subscribers": subscribers,
            "frame_bytes": frame_len,
            "completed_subscribers": got.completed,
            "framing_ok": got.tail_ok == got.completed and got.tail_bad == 0,
            "verified": verified,
            "first_mismatch": got.first_bad,
            # small reads mean the readers kept up (a reader that lags reads big chunks)
            "bytes_per_read": sum(got.counts) / max(1, got.reads),
            "eof_subscribers": len(got.eof),
            "closed_how": got.closes[:5],
            "timed_out": got.timed_out,
            "delivered": sum(c // frame_len for c in got.counts),
            "publisher": pub,
            "rss_before_kib": self.rss_before,
            # CPU used while the publisher was alive (start to finish, a little longer than
            # the measured first-to-last-byte window), as a share of that wall time
            "cpu_window_s": wall,
            "server_cpu_s": server_cpu,
            "server_cpu_share": server_cpu / wall,
            "reader_cpu_share": reader_cpu / wall,
            "publisher_cpu_share": pub_cpu / wall,
            "core_busy": cores,
            # other processes on this machine (and kernel work not charged to ours)
            "other_cpu_share": sum(cores.values()) - (server_cpu + reader_cpu + pub_cpu) / wall,
            **self.window,
        }
        elapsed = got.elapsed
        if elapsed and got.completed == subscribers:
            result["elapsed_s"] = elapsed
            result["deliveries_per_s"] = subscribers * messages / elapsed
            result["per_subscriber_per_s"] = messages / elapsed
            # from just before the publisher starts (a server that reads a large chunk of
            # publishes before writing any delivery makes "first byte" start late)
            result["from_start_s"] = got.t_last - self.start
            result["deliveries_per_s_from_start"] = (
                subscribers * messages / (got.t_last - self.start))
            # server CPU seconds per delivery, over the publisher's lifetime (see above)
            result["server_cpu_per_delivery_us"] = 1e6 * server_cpu / (subscribers * messages)
        return result


def members_busy(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                 wall: float) -> dict[str, dict[str, float]]:
    """Each named process's share of a core on it (``busy``) and waiting for one (``runq``)
    between two ``member_sched_ns()`` readings ``wall`` seconds apart."""
    return {name: {"busy": (after[name][0] - run) / 1e9 / wall,
                   "runq": (after[name][1] - wait) / 1e9 / wall}
            for name, (run, wait) in before.items() if name in after}


def publish_fanout(
    server: Server, proto, params: Params, *, messages: int, subscribers: int,
    stalled: bool = False, around: Callable | None = None, topics: int | None = None,
    ready: Callable[[], object] | None = None,
) -> dict:
    """One publisher, ``subscribers`` readers (plus one that never reads when ``stalled``).

    ``around``: a context-manager factory wrapped around the publishing phase (profiling).
    ``proto`` may be a :class:`wire.Mixed`: its ``pub`` publishes, its ``sub`` subscribes.
    ``topics``: how many topics the publisher cycles through (default ``params.topics``).
    ``ready()``: called once every client is connected, before the clock starts (e.g. to
    wait until a cluster's nodes know each other's subscribers)."""
    pub_proto = getattr(proto, "pub", proto)
    proto = getattr(proto, "sub", proto)
    port = server.port_for(proto.name)
    pub_port = server.port_for(pub_proto.name)
    sender = "pub"
    # message i goes to topics[i % k]; with k > 1 no two consecutive messages share a
    # topic (every subscriber subscribes to all k), which defeats batching of runs
    k = params.topics if topics is None else topics
    names = topic_names(k)
    size = params.payload_size
    frame_len = len(proto.delivered(sender, names[0], payload(0, size)))
    expected = messages * frame_len
    last = proto.delivered(sender, names[(messages - 1) % k], payload(messages - 1, size))
    stream = None
    if params.verify:
        stream = b"".join(
            proto.delivered(sender, names[i % k], payload(i, size)) for i in range(messages)
        )
    stalled_sock = None
    socks: list[socket.socket] = []
    try:
        if stalled:
            # first in the topic's subscriber order; tiny receive buffer; never read again
            stalled_sock = open_client(
                port, *proto.subscriber_setup("stalled", *names), rcvbuf=4096
            )
        setups = [proto.subscriber_setup(f"sub{i}", *names) for i in range(subscribers)]
        # a server of several nodes may spread the subscribers over their listeners
        spread = getattr(server, "subscriber_ports", None)
        if spread is not None:
            socks = open_spread(spread(proto.name, subscribers), setups, timeout=60.0)
        else:
            socks = open_many(port, setups, timeout=60.0)
        for sock in socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pub_sock = open_client(pub_port, *pub_proto.publisher_setup(sender))
        data = b"".join(
            pub_proto.publish(names[i % k], payload(i, size)) for i in range(messages)
        )
        if ready is not None:
            ready()
        measure = Measurement(server)
        deadline = time.monotonic() + params.scenario_timeout
        # with an ack window (Micromessage2 batch-ack), the subscribers acknowledge what
        # they read and the publisher keeps at most ``window`` messages unacknowledged
        on_read = None
        if getattr(proto, "window", None):
            on_read = cumulative_acker(len(socks), frame_len, proto.ack, proto.SEQ_CYCLE)
        with around() if around else contextlib.nullcontext():
            window = getattr(pub_proto, "window", None)
            if window:
                publisher = WindowedPublisher(
                    pub_sock, data, len(data) // messages, window, pub_proto.ack(1)[:-2],
                    params.scenario_timeout, pub_proto.SEQ_CYCLE,
                )
            else:
                publisher = Publisher(
                    pub_sock, data, messages * len(pub_proto.publish_reply),
                    params.scenario_timeout,
                )
            try:
                got = receive_counts(
                    socks, expected, last_frame=last, idle_timeout=params.idle_timeout,
                    deadline=deadline, expected_stream=stream,
                    verify_streams=params.verify_streams, on_read=on_read,
                    on_first=measure.first_byte,
                )
                measure.last_byte()
            finally:
                pub = publisher.finish()
        result = measure.figures(
            got, messages=messages, subscribers=subscribers, frame_len=frame_len, pub=pub,
            verified=(f"every byte of {min(subscribers, params.verify_streams)} streams, the "
                      "last frame of the others") if params.verify else "last frames",
        )
        result["topics"] = k
        if stalled_sock is not None:
            # the disconnect (if any) happened while the others were being served; allow
            # the reset a moment to arrive
            state = tcp_state(stalled_sock)
            wait_until = time.monotonic() + 2.0
            while state == "ESTABLISHED" and time.monotonic() < wait_until:
                time.sleep(0.05)
                state = tcp_state(stalled_sock)
            result["stalled_state"] = state
            result["stalled_disconnected"] = state != "ESTABLISHED"
            if state == "ESTABLISHED":
                # where its undelivered messages are: the client's receive queue, the
                # server's kernel send queue, and (the rest) the server's own memory
                client_q = struct.unpack("i", fcntl.ioctl(stalled_sock, termios.FIONREAD,
                                                          b"\0\0\0\0"))[0]
                server_q = tcp_send_queue(port, stalled_sock.getsockname()[1])
                result["stalled_client_queue"] = client_q
                result["stalled_server_kernel_queue"] = server_q
                if server_q is not None:
                    result["stalled_server_user_queue"] = expected - client_q - server_q
        result["rss_after_kib"] = server.rss_kib()
        if pub.get("error"):
            raise BenchError(f"publisher: {pub['error']}")
        return result
    finally:
        close_all(socks)
        if stalled_sock is not None:
            stalled_sock.close()


def topic_names(k: int) -> list[str]:
    """The topics of a run over ``k`` topics, all of one length (so all frames are)."""
    return [TOPIC] if k == 1 else [f"{TOPIC}{j:03d}" for j in range(k)]


def mcast(server: Server, proto, params: Params, around=None) -> dict:
    """1. MCAST 1 -> 1: msgs/s at the subscriber."""
    return publish_fanout(
        server, proto, params, messages=params.mcast_messages, subscribers=1, around=around
    )


def fanout(server: Server, proto, params: Params, around=None) -> dict:
    """2. fan-out 1 -> 100: deliveries/s."""
    return publish_fanout(
        server, proto, params, messages=params.fanout_messages,
        subscribers=params.fanout_subscribers, around=around,
    )


def stalled(server: Server, proto, params: Params, around=None) -> dict:
    """4. fan-out to 99 readers plus one subscriber that never reads."""
    return publish_fanout(
        server, proto, params, messages=params.stalled_messages,
        subscribers=params.fanout_subscribers - 1, stalled=True, around=around,
    )


def stmp_mcast(server: Server, proto, params: Params, around=None) -> dict:
    """1->1 at the STMP count (run for STMP, SSMP and Mosquitto alike)."""
    return publish_fanout(
        server, proto, params, messages=params.stmp_mcast_messages, subscribers=1,
        around=around,
    )


def stmp_fanout(server: Server, proto, params: Params, around=None) -> dict:
    """1->100 at the STMP count (run for STMP, SSMP and Mosquitto alike)."""
    return publish_fanout(
        server, proto, params, messages=params.stmp_fanout_messages,
        subscribers=params.fanout_subscribers, around=around,
    )


def stmp_cross(server: Server, proto, params: Params, around=None) -> dict:
    """1 -> ``cross_subscribers`` subscribers: SSMP publisher to STMP subscribers (``proto``
    a :class:`wire.Mixed`), or one protocol throughout (STMP or SSMP, the same-protocol
    baselines): server CPU per delivery."""
    return publish_fanout(
        server, proto, params, messages=params.cross_messages,
        subscribers=params.cross_subscribers, around=around,
    )


def mm2_mcast(server: Server, proto, params: Params, around=None) -> dict:
    """1->1 at the MM2 count, no acks (run for MM2, SSMP and Mosquitto alike)."""
    return publish_fanout(
        server, proto, params, messages=params.mm2_mcast_messages, subscribers=1,
        around=around,
    )


def mm2_ack(server: Server, proto, params: Params, around=None) -> dict:
    """1->1 at the MM2 ack count; for MM2 with batch-ack (``max-count``) on the publisher
    and the subscriber: the publisher waits for the server's acks, the subscriber acks what
    it receives. SSMP and Mosquitto (QoS 0) run as in mm2-mcast, for the ratios."""
    if isinstance(proto, MM2):
        proto = MM2(window=params.mm2_ack_window)
    result = publish_fanout(
        server, proto, params, messages=params.mm2_ack_messages, subscribers=1, around=around,
    )
    if isinstance(proto, MM2):
        result["ack_window"] = proto.window
    return result


def mm2_fanout(server: Server, proto, params: Params, around=None) -> dict:
    """1->100 at the MM2 count, no acks (run for MM2, SSMP and Mosquitto alike)."""
    return publish_fanout(
        server, proto, params, messages=params.mm2_fanout_messages,
        subscribers=params.fanout_subscribers, around=around,
    )


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def latency(server: Server, proto, params: Params, around=None) -> dict:
    """3. echo round trips, one at a time: p50/p99 in microseconds."""
    port = server.port
    # a server of several nodes may hold the echo on another node than the client
    echo_port = getattr(server, "echo_port", port)
    size = params.payload_size
    total = params.latency_warmup + params.latency_round_trips
    # the echo outlives any plausible run (each round trip itself times out after 5 s)
    echo_timeout = max(params.scenario_timeout, 60 + 0.2 * total)
    if isinstance(proto, SSMP):
        client = open_client(port, *proto.publisher_setup("ping"))
        echo_sock = open_client(echo_port, *proto.publisher_setup("echo"))
        frames = [proto.ucast("echo", payload(i, size)) for i in range(total)]
        answers = [b"200\n" + proto.ucast_event("echo", "ping", payload(i, size)) for i in
                   range(total)]
        echo = Echo(echo_sock, "ssmp", (b"ping", b"echo"), echo_timeout)
    else:
        assert isinstance(proto, MQTT)
        client = open_client(port, *proto.subscriber_setup("ping", "lat/pong"))
        echo_sock = open_client(echo_port, *proto.subscriber_setup("echo", "lat/ping"))
        frames = [proto.publish("lat/ping", payload(i, size)) for i in range(total)]
        answers = [proto.publish("lat/pong", payload(i, size)) for i in range(total)]
        echo = Echo(echo_sock, "mqtt", (b"lat/pong",), echo_timeout)
    samples: list[int] = []
    bad = 0
    perf = time.perf_counter_ns
    try:
        client.settimeout(5.0)
        recv_into = client.recv_into
        buf = bytearray(65536)
        with around() if around else contextlib.nullcontext():
            for i in range(total):
                if i == params.latency_warmup:  # the server's CPU over the measured ones
                    server_start = server.sched_ns()[0]
                want = len(answers[i])
                t0 = perf()
                client.sendall(frames[i])
                got = 0
                while got < want:
                    n = recv_into(memoryview(buf)[got:], want - got)
                    if n == 0:
                        raise BenchError(f"connection closed at round trip {i}")
                    got += n
                t1 = perf()
                if buf[:want] != answers[i]:
                    bad += 1
                if i >= params.latency_warmup:
                    samples.append(t1 - t0)
            server_ns = server.sched_ns()[0] - server_start
    except TimeoutError:
        raise BenchError(f"no echo within 5 s at round trip {len(samples)}") from None
    finally:
        client.close()
        echo_result = echo.finish()
    if echo_result.get("error"):
        raise BenchError(f"echo: {echo_result['error']}")
    samples.sort()
    return {
        "round_trips": len(samples),
        "warmup": params.latency_warmup,
        "wrong_answers": bad,
        "p50_us": percentile(samples, 50) / 1000,
        "p90_us": percentile(samples, 90) / 1000,
        "p99_us": percentile(samples, 99) / 1000,
        "max_us": samples[-1] / 1000,
        "mean_us": sum(samples) / len(samples) / 1000,
        "round_trips_per_s": 1e9 * len(samples) / sum(samples),
        # the server's CPU (both of its hops, and the echo's round of answers) per round trip
        "server_cpu_per_round_trip_us": server_ns / 1000 / len(samples),
    }


def idle(server: Server, proto, params: Params, around=None) -> dict:
    """5. many idle subscribed connections: accept and login rates, resident memory per
    connection, then a new connection served (bench/idle.py)."""
    return idle_scenario.run(server, proto, params, window=params.idle_window)


SCENARIOS = {
    "mcast": (1, "MCAST 1->1", mcast),
    "fanout": (2, "fan-out 1->100", fanout),
    "latency": (3, "UCAST echo latency", latency),
    "stalled": (4, "stalled subscriber among 100", stalled),
    "idle": (5, "idle connections", idle),
    "stmp-mcast": (6, "STMP binary publish 1->1", stmp_mcast),
    "stmp-fanout": (7, "STMP fan-out 1->100", stmp_fanout),
    "stmp-cross": (8, "cross-protocol: SSMP->STMP against STMP->STMP and SSMP->SSMP", stmp_cross),
    "mm2-mcast": (9, "Micromessage2 publish 1->1, no acks", mm2_mcast),
    "mm2-ack": (10, "Micromessage2 publish 1->1, batch-ack window 100 both ways "
                    "(SSMP, Mosquitto: no acks)", mm2_ack),
    "mm2-fanout": (11, "Micromessage2 fan-out 1->100, no acks", mm2_fanout),
}

#: which servers/protocols each scenario drives (default: ssmp, mosquitto)
KINDS = {
    "stmp-mcast": ["stmp", "ssmp", "mosquitto"],
    "stmp-fanout": ["stmp", "ssmp", "mosquitto"],
    "stmp-cross": ["stmp", "ssmp->stmp", "ssmp"],
    "mm2-mcast": ["mm2", "ssmp", "mosquitto"],
    "mm2-ack": ["mm2", "ssmp", "mosquitto"],
    "mm2-fanout": ["mm2", "ssmp", "mosquitto"],
    "idle": ["ssmp", "stmp", "mm2", "mosquitto"],
}

# the sbus scenarios (12-16) live in bench/sbus.py, which uses publish_fanout above
import sbus  # noqa: E402

SCENARIOS.update(sbus.SCENARIOS)
KINDS.update(sbus.KINDS)

# scenario 17, the journal's cost, lives in bench/journal.py
import journal  # noqa: E402

SCENARIOS.update(journal.SCENARIOS)
KINDS.update(journal.KINDS)

# scenarios 18 and 19, the ACL's cost, live in bench/acl.py
import acl  # noqa: E402

SCENARIOS.update(acl.SCENARIOS)
KINDS.update(acl.KINDS)

# scenarios 20-23, the workloads real clients make (mixed topics, request/reply), live in
# bench/mixed.py
import mixed  # noqa: E402

SCENARIOS.update(mixed.SCENARIOS)
KINDS.update(mixed.KINDS)
