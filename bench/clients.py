"""Raw-socket clients: connect-and-login and a byte-counting multi-socket reader (the
publisher and echo processes are in :mod:`senders`). Everything waits with a deadline;
nothing parses per message on the measured path."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from procs import HOST

_fork = multiprocessing.get_context("fork")
TCP_STATES = {1: "ESTABLISHED", 7: "CLOSE (reset)", 8: "CLOSE_WAIT (server closed)"}


class BenchError(Exception):
    """A scenario could not run as designed (setup failed, timeout, wrong bytes)."""


def recv_exactly(sock: socket.socket, n: int, timeout: float) -> bytes:
    """Read exactly ``n`` bytes (never more, so nothing after them is consumed)."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"timed out waiting for {n} bytes, got {bytes(buf)!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            continue
        if not chunk:
            raise BenchError(f"connection closed after {bytes(buf)!r}, wanted {n} bytes")
        buf += chunk
    return bytes(buf)


def open_client(
    port: int, setup: bytes, expect: bytes, timeout: float = 10.0, rcvbuf: int | None = None
) -> socket.socket:
    """Connect, send ``setup``, check the answer is exactly ``expect``; blocking socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        _setup(sock, port, setup, expect, timeout, rcvbuf)
    except BaseException:
        sock.close()
        raise
    return sock


def _setup(sock, port, setup, expect, timeout, rcvbuf) -> None:
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)
    sock.connect((HOST, port))
    sock.sendall(setup)
    got = recv_exactly(sock, len(expect), timeout)
    if got != expect:
        raise BenchError(f"setup answered {got!r}, expected {expect!r}")
    sock.settimeout(timeout)


def open_many(
    port: int, setups: list[tuple[bytes, bytes]], *, window: int = 40, timeout: float = 120.0,
    progress: bool = False,
) -> list[socket.socket]:
    """Open one connection per ``(setup, expected answer)``, at most ``window`` in progress
    at once (below the listen backlog, so no SYN is dropped and retried), all non-blocking.
    Returns the sockets in order; raises :class:`BenchError` on any failure or the deadline."""
    socks: list[socket.socket] = []
    try:
        _open_many(port, setups, socks, window, timeout, progress)
    except BaseException:
        close_all(socks)
        raise
    return socks


def open_spread(
    ports: list[int], setups: list[tuple[bytes, bytes]], *, window: int = 40,
    timeout: float = 120.0,
) -> list[socket.socket]:
    """:func:`open_many` with connection ``i`` on ``ports[i]`` (clients spread over several
    listeners, e.g. the nodes of a cluster). Returns the sockets in ``setups``' order."""
    if len(ports) != len(setups):
        raise ValueError("one port per setup")
    by_port: dict[int, list[int]] = {}
    for index, port in enumerate(ports):
        by_port.setdefault(port, []).append(index)
    socks: list[socket.socket | None] = [None] * len(setups)
    try:
        for port, indexes in by_port.items():
            opened = open_many(port, [setups[i] for i in indexes], window=window,
                               timeout=timeout)
            for index, sock in zip(indexes, opened, strict=True):
                socks[index] = sock
    except BaseException:
        close_all(s for s in socks if s is not None)
        raise
    return [s for s in socks if s is not None]


def close_all(socks) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()


def _open_many(port, setups, socks, window, timeout, progress) -> None:
    ep = select.epoll()
    pending: dict[int, list] = {}  # fd -> [index, sock, connected, answer bytes]
    done = 0
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    try:
        while done < len(setups):
            while len(socks) < len(setups) and len(pending) < window:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.setblocking(False)
                err = sock.connect_ex((HOST, port))
                if err not in (0, errno.EINPROGRESS):
                    raise BenchError(f"connect #{len(socks) - 1}: {errno.errorcode.get(err, err)}")
                pending[sock.fileno()] = [len(socks) - 1, sock, False, bytearray()]
                ep.register(sock.fileno(), select.EPOLLOUT)
            if time.monotonic() > deadline:
                raise BenchError(f"opened only {done} of {len(setups)} connections in {timeout} s")
            for fd, _ in ep.poll(0.5):
                entry = pending[fd]
                index, sock, connected, answer = entry
                if not connected:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise BenchError(f"connect #{index}: {errno.errorcode.get(err, err)}")
                    sock.sendall(setups[index][0])  # small: fits the empty send buffer
                    entry[2] = True
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    chunk = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError as e:
                    raise BenchError(f"connection #{index}: {e}") from None
                if not chunk:
                    raise BenchError(f"connection #{index} closed during setup ({bytes(answer)!r})")
                answer += chunk
                expect = setups[index][1]
                if len(answer) >= len(expect):
                    if bytes(answer) != expect:
                        raise BenchError(f"connection #{index}: {bytes(answer)!r} != {expect!r}")
                    ep.unregister(fd)
                    del pending[fd]
                    done += 1
            if progress and time.monotonic() - last_report > 2.0:
                last_report = time.monotonic()
                print(f"      ... {done}/{len(setups)} connections", flush=True)
    finally:
        ep.close()


@dataclass
class Received:
    expected_each: int
    counts: list[int]
    t_first: float | None = None
    t_last: float | None = None
    completed: int = 0
    eof: list[int] = field(default_factory=list)
    tail_ok: int = 0
    tail_bad: int = 0
    first_bad: str | None = None
    reads: int = 0
    closes: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def elapsed(self) -> float | None:
        if self.t_first is None or self.t_last is None:
            return None
        return self.t_last - self.t_first


#: the readers' pause (seconds) after a round of reads that found less than PAUSE_BELOW
#: bytes in all: see :func:`receive_counts`
READER_PAUSE = 0.001
PAUSE_BELOW = 32 * 1024


def receive_counts(
    socks: list[socket.socket], expected_each: int, *, last_frame: bytes | None,
    idle_timeout: float, deadline: float, expected_stream: bytes | None = None,
    verify_streams: int = 10, check_stream: Callable[[int, bytearray], str | None] | None = None,
    on_read: Callable[[int, socket.socket, int], None] | None = None,
    on_first: Callable[[], None] | None = None,
    pause: float = READER_PAUSE, pause_below: int = PAUSE_BELOW,
    last_frames: list[bytes] | None = None,
) -> Received:
    """Read every socket until it has delivered ``expected_each`` bytes, counting bytes only.

    Times the first byte seen on any socket to the moment the last socket completes.
    With ``expected_stream`` the first ``verify_streams`` sockets' bytes are received straight
    into a buffer of the expected size (no parsing, no extra copy) and compared with it once
    the clock has stopped; for the others only the final frame is compared with
    ``last_frame`` (None: not at all, when the order of frames is not known in advance).
    ``check_stream(index, data)`` instead of ``expected_stream``: the kept streams are
    checked by it (None when right, else what is wrong), e.g. when frames from several
    publishers interleave in an order no one can predict.
    Stops early after ``idle_timeout`` s without data or at ``deadline`` (monotonic).
    ``on_read(index, sock, count)``, when given, runs after every read with that socket's
    byte count so far (e.g. to acknowledge what arrived: :func:`cumulative_acker`);
    ``on_first()`` runs when the first byte arrives (the measured window opens).

    A reader that keeps up would wait in ``epoll_wait`` for every delivery, and then each
    of the server's writes has to wake it: measured against Mosquitto 1 -> 1, that costs
    the server about 1.3 us of its own CPU per message (7.5 against 6.2 us, ~20% of its
    rate), a cost of the client's making. So after a round of reads that found less than
    ``pause_below`` bytes in all (the readers are ahead of the server), the reader sleeps
    ``pause`` seconds: deliveries pile up in the kernel meanwhile, with nobody to wake,
    and the next round reads them in bulk. A reader that is behind reads big chunks and
    never pauses. Not with ``on_read``: acknowledgements must not wait (the publisher's
    window would stall).

    ``last_frames``: instead of ``last_frame``, socket ``i``'s own last frame (all of one
    length), when the sockets hear different publishers."""
    if last_frames is not None:
        if len(last_frames) != len(socks) or len({len(f) for f in last_frames}) > 1:
            raise ValueError("one last frame per socket, all of one length")
        last_frame = last_frames[0] if last_frames else None
    result = Received(expected_each, [0] * len(socks))
    if not socks:
        return result
    ep = select.epoll()
    tail_len = 0 if last_frame is None else len(last_frame)
    keeping = expected_stream is not None or check_stream is not None
    n_keep = min(verify_streams, len(socks)) if keeping else 0
    if on_read is not None:
        pause = 0.0
    sleep = time.sleep
    # fd -> [index, sock, count, tail (or, for a verified stream, the whole stream, read
    # straight into a buffer of the expected size: no copy beyond the kernel's)]
    active = {
        s.fileno(): [i, s, 0, bytearray(expected_each if i < n_keep else 0)]
        for i, s in enumerate(socks)
    }
    received: list[bytearray] = [entry[3] for entry in active.values()]
    windows = {fd: memoryview(entry[3]) for fd, entry in active.items() if entry[0] < n_keep}
    for sock in socks:
        sock.setblocking(False)
        ep.register(sock.fileno(), select.EPOLLIN)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    counts = result.counts
    perf = time.perf_counter
    last_data = time.monotonic()
    try:
        while active:
            events = ep.poll(0.1)
            round_bytes = 0
            if not events:
                now = time.monotonic()
                if now - last_data > idle_timeout or now > deadline:
                    result.timed_out = True
                    break
                continue
            for fd, _ in events:
                entry = active[fd]
                window = windows.get(fd)
                try:
                    if window is not None:
                        n = entry[1].recv_into(window[entry[2] :])
                    else:
                        n = entry[1].recv_into(buf)
                except BlockingIOError:
                    continue
                except OSError as e:
                    result.closes.append(f"#{entry[0]} after {entry[2]} B: {e.strerror}")
                    n = -1
                if n <= 0:
                    if n == 0:
                        result.closes.append(f"#{entry[0]} after {entry[2]} B: end of stream")
                    result.eof.append(entry[0])
                    counts[entry[0]] = entry[2]
                    ep.unregister(fd)
                    del active[fd]
                    continue
                if result.t_first is None:
                    result.t_first = perf()
                    if on_first is not None:
                        on_first()
                result.reads += 1
                round_bytes += n
                count = entry[2] + n
                entry[2] = count
                if on_read is not None:
                    on_read(entry[0], entry[1], count)
                if window is None and tail_len and count > expected_each - tail_len:
                    tail = entry[3]  # in place: ``received`` holds it
                    tail += view[:n]
                    del tail[:-tail_len]
                if count >= expected_each:
                    result.t_last = perf()
                    result.completed += 1
                    counts[entry[0]] = count
                    ep.unregister(fd)
                    del active[fd]
            last_data = time.monotonic()
            if last_data > deadline:
                result.timed_out = True
                break
            if round_bytes < pause_below and pause:
                sleep(pause)
    finally:
        ep.close()
        for entry in active.values():
            counts[entry[0]] = entry[2]
    windows.clear()
    for index, data in enumerate(received):
        if counts[index] < expected_each:
            continue
        if counts[index] != expected_each:
            problem: str | None = f"{counts[index]} bytes, expected {expected_each}"
        elif index < n_keep and check_stream is not None:
            problem = check_stream(index, data)
        else:
            want = expected_stream if index < n_keep else (
                last_frame if last_frames is None else last_frames[index])
            problem = None if want is None or data == want else _first_difference(data, want)
        if problem is None:
            result.tail_ok += 1
        else:
            result.tail_bad += 1
            if result.first_bad is None:
                result.first_bad = f"stream {index}, {problem}"
    return result


def cumulative_acker(
    n_socks: int, frame_len: int, ack: Callable[[int], bytes], cycle: int = 0xFFFF
) -> Callable[[int, socket.socket, int], None]:
    """An ``on_read`` for :func:`receive_counts`: after each read, acknowledge every whole
    frame received so far with one cumulative ack, ``ack(seq)`` where the ``k``-th message's
    seq is ``(k - 1) % cycle + 1`` (every delivered frame of a run has ``frame_len`` bytes)."""
    acked = [0] * n_socks

    def on_read(index: int, sock: socket.socket, count: int) -> None:
        k = count // frame_len
        if k > acked[index]:
            try:
                sock.send(ack((k - 1) % cycle + 1))
            except BlockingIOError:  # a few bytes on an idle send buffer: never seen; the
                return  # next read acknowledges again (acked[index] is left as it was)
            acked[index] = k

    return on_read


def _first_difference(got: bytes | bytearray, want: bytes) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return (f"byte {i}: got {bytes(got[max(0, i - 40) : i + 40])!r}, "
                    f"expected {want[max(0, i - 40) : i + 40]!r}")
    return f"lengths differ: got {len(got)}, expected {len(want)}"


def tcp_state(sock: socket.socket) -> str:
    """The kernel's TCP state of ``sock`` (ESTABLISHED, CLOSE after a reset, ...)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    state = info[0]
    return TCP_STATES.get(state, f"state {state}")
