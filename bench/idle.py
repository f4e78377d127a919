"""Scenario 5, ``idle``: N connections held at once (50,000 with ``--idle-connections 50000``),
for SSMP, STMP, MM2 and Mosquitto in one invocation.

Two timed phases, from zero to N, each with the server's time on its core (schedstat):

1. accept: N TCP connections, nothing sent. A connection counts when the server has taken
   it from its listen queue (``accept``): the harness reads the queue's length from the
   kernel (netlink sock_diag, the ``Recv-Q`` that ``ss -ltn`` shows) and keeps at most
   ``ACCEPT_WINDOW`` (50) connections waiting in it, below every server's backlog (Mosquitto
   listens with 100, msgbroker with ``--listen-backlog``, 1024), so no SYN is dropped and
   retried a second later;
2. login: on those connections, each logs in with its own id and subscribes to one topic
   (``wire.*.subscriber_setup``); a connection counts once the server's whole answer came
   back (SSMP ``200`` twice; STMP's two Ok responses; MM2's handshake step 2, its
   subscription has no answer; MQTT CONNACK and SUBACK), at most ``--idle-window`` logins
   in progress at once.

Then the server's VmRSS per connection (after minus before the phases; one connection logs
in and subscribes before "before", so the first one's costs are left out), a new connection
that logs in and pings (SSMP, MQTT; STMP and MM2 have no ping: its login answered is the
proof), and whether any of the N was closed or sent anything meanwhile.

The clients are one process: non-blocking sockets, one epoll, a few system calls per
connection, so the server is the limit (its busy share is reported per phase). From one
source address to one server port, the local port range (32768-60999) has room for 28,232
connections, and connect() gets slower as it fills (the kernel scans for a free port: at
19,800 from one address the harness could open only about 1,300 a second): connection ``i``
binds to 127.0.0.``1 + i // SOURCE_SPAN`` (5,000; with IP_BIND_ADDRESS_NO_PORT, so the port
is picked at connect for the whole 4-tuple); all of 127/8 is loopback on Linux, nothing is
configured. The file descriptor limit of the harness
(and so of the servers it starts) is raised to what N needs, the hard limit too when root
(``procs.raise_nofile``); the brokers' own defaults are left alone.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time

from clients import BenchError, close_all, open_client, recv_exactly

#: connections at most in the server's listen queue at once (phase 1)
ACCEPT_WINDOW = 50
#: connections from one source address (127.0.0.X) before the next one is used
SOURCE_SPAN = 5_000
#: IP_BIND_ADDRESS_NO_PORT (linux/in.h): bind the address now, pick the port at connect
IP_BIND_ADDRESS_NO_PORT = 24

_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_DONE, _NLMSG_ERROR = 3, 2
_TCP_LISTEN = 10


class ListenQueue:
    """The length of a loopback listener's accept queue, from the kernel (sock_diag)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
        # inet_diag_req_v2: family, protocol, ext, pad, states; then an empty sockid
        req = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN)
        req += bytes(48)
        self.request = struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY,
                                   _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + req

    def length(self) -> int:
        self.sock.send(self.request)
        found = 0
        while True:
            data = self.sock.recv(65536)
            at = 0
            while at + 16 <= len(data):
                size, kind = struct.unpack_from("=IH", data, at)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag: error answer")
                # inet_diag_msg: family, state, timer, retrans, then sockid (sport first,
                # network order), ... expires, rqueue
                sport = struct.unpack_from("!H", data, at + 16 + 4)[0]
                if sport == self.port:
                    found = struct.unpack_from("=I", data, at + 16 + 4 + 48 + 4)[0]
                at += (size + 3) & ~3

    def close(self) -> None:
        self.sock.close()


def _source(index: int) -> str:
    return f"127.0.0.{1 + index // SOURCE_SPAN}"


def accept_phase(server, port: int, count: int, timeout: float, progress: bool) -> tuple:
    """Open ``count`` TCP connections to ``port``, at most ACCEPT_WINDOW waiting in the
    listen queue. Returns (sockets, seconds from the first connect to the last accept,
    server busy share over it)."""
    queue = ListenQueue(port)
    ep = select.epoll()
    socks: list[socket.socket] = []
    t0 = time.perf_counter()
    sched0 = server.sched_ns()
    try:
        _accept_all(port, count, socks, ep, queue, time.monotonic() + timeout, progress)
        seconds = time.perf_counter() - t0
        sched1 = server.sched_ns()
        _check_connected(socks)
    except BaseException:
        close_all(socks)
        raise
    finally:
        ep.close()
        queue.close()
    return socks, seconds, _shares(sched0, sched1, seconds)


def _shares(sched0: tuple[int, int], sched1: tuple[int, int], seconds: float) -> tuple:
    """(on its core, waiting for its core) as shares of ``seconds``: the rest it was idle,
    waiting for the clients."""
    return ((sched1[0] - sched0[0]) / 1e9 / seconds, (sched1[1] - sched0[1]) / 1e9 / seconds)


def _accept_all(port, count, socks, ep, queue, deadline, progress) -> None:
    connecting: set[int] = set()
    established = queued = 0  # queued: established here, not yet accepted there
    spread = True
    last_report = time.monotonic()
    while True:
        # connecting (the SYN sent) and queued: what the server has not taken yet
        while len(socks) < count and len(connecting) + queued < ACCEPT_WINDOW:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setblocking(False)
            if spread:
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.bind((_source(len(socks) - 1), 0))
            err = sock.connect_ex(("127.0.0.1", port))
            if err not in (0, errno.EINPROGRESS):
                raise BenchError(f"connect #{len(socks) - 1}: {errno.errorcode.get(err, err)}")
            connecting.add(sock.fileno())
            ep.register(sock.fileno(), select.EPOLLOUT)
        # a connect completes at once on loopback; the server's accepts are watched by
        # asking the kernel again right away (on the harness's core, not the server's)
        for fd, _ in ep.poll(0.001 if connecting else 0):
            ep.unregister(fd)
            connecting.discard(fd)
            established += 1
        queued = queue.length()
        if established == count and queued == 0:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{established} connected, {queued} not accepted in time")
        if progress and time.monotonic() - last_report > 2.0:
            last_report = time.monotonic()
            print(f"      ... {established - queued}/{count} accepted", flush=True)


def _check_connected(socks) -> None:
    for sock in socks:
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise BenchError(f"connect: {errno.errorcode.get(err, err)}")


def login_phase(server, socks: list[socket.socket], setups: list[tuple[bytes, bytes]],
                window: int, timeout: float, progress: bool) -> tuple[float, tuple]:
    """Send each connection its setup, at most ``window`` unanswered at once; a connection
    is done when its exact expected answer came back. Returns (seconds, server busy)."""
    ep = select.epoll()
    t0 = time.perf_counter()
    sched0 = server.sched_ns()
    try:
        _login_all(socks, setups, window, ep, time.monotonic() + timeout, progress)
        seconds = time.perf_counter() - t0
        sched1 = server.sched_ns()
    finally:
        ep.close()
    return seconds, _shares(sched0, sched1, seconds)


def _login_all(socks, setups, window, ep, deadline, progress) -> None:
    pending: dict[int, list] = {}  # fd -> [index, answer so far]
    by_fd = {sock.fileno(): sock for sock in socks}
    sent = done = 0
    last_report = time.monotonic()
    while done < len(socks):
        while sent < len(socks) and len(pending) < window:
            sock = socks[sent]
            sock.send(setups[sent][0])  # small: fits the empty send buffer
            pending[sock.fileno()] = [sent, b""]
            ep.register(sock.fileno(), select.EPOLLIN)
            sent += 1
        for fd, _ in ep.poll(0.5):
            entry = pending[fd]
            try:
                chunk = by_fd[fd].recv(4096)
            except BlockingIOError:
                continue
            if not chunk:
                raise BenchError(f"connection #{entry[0]} closed during its login")
            entry[1] += chunk
            expect = setups[entry[0]][1]
            if len(entry[1]) >= len(expect):
                if entry[1] != expect:
                    raise BenchError(f"connection #{entry[0]}: {entry[1]!r} != {expect!r}")
                ep.unregister(fd)
                del pending[fd]
                done += 1
        if time.monotonic() > deadline:
            raise BenchError(f"{done} of {len(socks)} logged in in time")
        if progress and time.monotonic() - last_report > 2.0:
            last_report = time.monotonic()
            print(f"      ... {done}/{len(socks)} logged in", flush=True)


def still_there(socks: list[socket.socket]) -> tuple[int, int]:
    """(closed, sent something) among ``socks``, looking for half a second."""
    ep = select.epoll()
    closed = data = 0
    try:
        for sock in socks:
            ep.register(sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
        for _, event in ep.poll(0.5, len(socks)):
            if event & (select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                closed += 1
            else:
                data += 1
    finally:
        ep.close()
    return closed, data


def run(server, proto, params, *, window: int) -> dict:
    """Scenario 5 against one server (see the module docstring)."""
    port = server.port_for(proto.name)
    count = params.idle_connections
    setups = [proto.subscriber_setup(f"idle{i}", "idle") for i in range(count)]
    # one connection first, as the N will be: what the first one costs (imports, caches,
    # the topic) is not any connection's own
    warm = open_client(port, *proto.subscriber_setup("idle-warm", "idle"))
    time.sleep(0.2)
    rss_before = server.rss_kib()
    own0 = os.times()
    try:
        socks, accept_s, accept_busy = accept_phase(server, port, count,
                                                    params.scenario_timeout, progress=True)
    except BaseException:
        warm.close()
        raise
    try:
        rss_accepted = server.rss_kib()
        login_s, login_busy = login_phase(server, socks, setups, window,
                                          params.scenario_timeout, progress=True)
        own1 = os.times()
        time.sleep(0.5)  # what the server still does after its last answer (logs, timers)
        rss_after = server.rss_kib()
        # a new connection is still served: logs in (and pings, where the protocol can)
        t1 = time.perf_counter()
        check = open_client(port, *proto.subscriber_setup("idle-check", "idle-check"))
        try:
            if proto.pong:
                check.sendall(proto.ping)
                served = recv_exactly(check, len(proto.pong), 10.0) == proto.pong
            else:
                served = True  # its login was answered exactly
        finally:
            check.close()
        served_ms = 1000 * (time.perf_counter() - t1)
        closed, data = still_there(socks)
        rss_final = server.rss_kib()
    finally:
        close_all([*socks, warm])
    return {
        "connections": count,
        "accept_seconds": accept_s,
        "accepts_per_s": count / accept_s,
        "accept_server_busy": accept_busy[0],
        "accept_server_runq": accept_busy[1],
        "login_seconds": login_s,
        "logins_per_s": count / login_s,
        "login_server_busy": login_busy[0],
        "login_server_runq": login_busy[1],
        "login_window": window,
        "harness_cpu_s": (own1.user + own1.system) - (own0.user + own0.system),
        "rss_before_kib": rss_before,
        "rss_accepted_kib": rss_accepted,
        "rss_after_kib": rss_after,
        "rss_final_kib": rss_final,
        "bytes_per_connection": 1024 * (rss_after - rss_before) / count,
        "bytes_per_accepted_connection": 1024 * (rss_accepted - rss_before) / count,
        "ping_ok": served,
        "ping_kind": "PING" if proto.pong else "login",
        "ping_ms": served_ms,
        "closed": closed,
        "sent_meanwhile": data,
        "closed_or_unexpected_data": closed + data,
    }


def describe(r: dict, fmt) -> str:
    return (
        f"{r['connections']:,} connections: accepted in {r['accept_seconds']:.1f} s = "
        f"{fmt(r['accepts_per_s'])}/s (server busy {100 * r['accept_server_busy']:.0f}%, "
        f"waiting for its core {100 * r['accept_server_runq']:.0f}%), "
        f"logged in and subscribed in {r['login_seconds']:.1f} s = {fmt(r['logins_per_s'])}/s "
        f"(server busy {100 * r['login_server_busy']:.0f}%, waiting for its core "
        f"{100 * r['login_server_runq']:.0f}%, {r['login_window']} at once; "
        f"harness CPU {r['harness_cpu_s']:.1f} s); RSS {fmt(r['rss_before_kib'] / 1024)} -> "
        f"{fmt(r['rss_after_kib'] / 1024)} MiB = {fmt(r['bytes_per_connection'])} "
        f"B/connection ({fmt(r['bytes_per_accepted_connection'])} once accepted, before "
        f"login); a new connection's {r['ping_kind']}: "
        f"{'answered' if r['ping_ok'] else 'WRONG ANSWER'} in {r['ping_ms']:.1f} ms; "
        f"of the {r['connections']:,}: {r['closed']} closed, {r['sent_meanwhile']} sent "
        f"something meanwhile"
    )
