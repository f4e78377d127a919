"""Raw-socket sending clients, each a child process: a publisher that blasts a pre-encoded
buffer (one socket, many sockets, or within an acknowledgement window) and an echo that
answers every message. Split from :mod:`clients` (connecting, reading); the same rules:
everything waits with a deadline, nothing parses per message on the measured path except
the echo (which must, to answer)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import socket
import struct
import time

from clients import BenchError, close_all
from wire import parse_mqtt_packets

_fork = multiprocessing.get_context("fork")


# -- publisher: a child process that blasts a pre-encoded buffer ---------------------------


def _publisher_main(sock, data, reply_bytes, conn, stop, timeout) -> None:
    """Send ``data`` as fast as the socket takes it while reading (and discarding) the
    server's per-publish replies; then wait for ``stop`` before closing."""
    result = {"sent": 0, "replies": 0, "error": None}
    try:
        sock.setblocking(False)
        view = memoryview(data)
        total = len(data)
        sent = 0
        got = 0
        rbuf = bytearray(1 << 18)
        ep = select.epoll()
        ep.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        writing = True
        while (sent < total or got < reply_bytes) and time.monotonic() < deadline:
            for _, events in ep.poll(0.2):
                if events & select.EPOLLIN:
                    try:
                        n = sock.recv_into(rbuf)
                    except BlockingIOError:
                        n = -1
                    if n == 0:
                        result["error"] = "server closed the publisher's connection"
                        stop.set()
                        break
                    if n > 0:
                        got += n
                if writing and events & select.EPOLLOUT:
                    with contextlib.suppress(BlockingIOError):
                        sent += sock.send(view[sent : sent + (1 << 18)])
                    if sent >= total:
                        writing = False
                        result["send_seconds"] = time.perf_counter() - t0
                        ep.modify(sock.fileno(), select.EPOLLIN)
            if stop.is_set():
                break
        result["sent"] = sent
        result["replies"] = got
        times = os.times()
        result["cpu_seconds"] = times.user + times.system
        ep.close()
    except Exception as e:  # reported to the parent, never raised in the child
        result["error"] = f"{type(e).__name__}: {e}"
    conn.send(result)
    stop.wait(timeout)
    sock.close()


class Publisher:
    """A forked process publishing ``data`` on the already logged-in ``sock``."""

    def __init__(self, sock: socket.socket, data: bytes, reply_bytes: int, timeout: float):
        self._start(sock, _publisher_main, (sock, data, reply_bytes), timeout)

    def _start(self, sock: socket.socket, target, args: tuple, timeout: float) -> None:
        self.stop_event = _fork.Event()
        self.parent, child = _fork.Pipe(duplex=False)
        self.proc = _fork.Process(
            target=target, args=(*args, child, self.stop_event, timeout), daemon=True
        )
        self.proc.start()
        sock.close()  # the child holds its own copy

    def finish(self, timeout: float = 10.0) -> dict:
        result: dict = {"error": "publisher reported nothing"}
        if self.parent.poll(timeout):
            result = self.parent.recv()
        self.stop_event.set()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5.0)
        return result


def _multi_publisher_main(socks, datas, reply_bytes, conn, stop, timeout) -> None:
    """Send ``datas[i]`` on ``socks[i]``, all at once, each as fast as its socket takes it
    (at most 64 KiB per send, so the connections' data interleave at the server), reading
    (and discarding) each one's ``reply_bytes[i]`` of per-publish replies."""
    result: dict = {"sent": 0, "replies": 0, "error": None}
    try:
        ep = select.epoll()
        # fd -> [sock, view, sent, replies left]
        state = {}
        for sock, data, replies in zip(socks, datas, reply_bytes, strict=True):
            sock.setblocking(False)
            state[sock.fileno()] = [sock, memoryview(data), 0, replies]
            ep.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        busy = len(state)
        rbuf = bytearray(1 << 16)
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        while busy and time.monotonic() < deadline and not stop.is_set():
            for fd, events in ep.poll(0.2):
                entry = state[fd]
                sock, view, sent, left = entry
                if events & select.EPOLLIN:
                    try:
                        n = sock.recv_into(rbuf)
                    except BlockingIOError:
                        n = -1
                    if n == 0:
                        result["error"] = "the server closed a publisher's connection"
                        busy = 0
                        break
                    if n > 0:
                        entry[3] = left = left - n
                        result["replies"] += n
                if events & select.EPOLLOUT and sent < len(view):
                    with contextlib.suppress(BlockingIOError):
                        entry[2] = sent = sent + sock.send(view[sent : sent + (1 << 16)])
                    if sent == len(view):
                        ep.modify(fd, select.EPOLLIN)
                if sent == len(view) and left <= 0:
                    ep.unregister(fd)
                    busy -= 1
        result["send_seconds"] = time.perf_counter() - t0
        result["sent"] = sum(entry[2] for entry in state.values())
        if busy and not stop.is_set() and not result["error"]:
            result["error"] = f"{busy} of {len(socks)} publishers not done in {timeout} s"
        times = os.times()
        result["cpu_seconds"] = times.user + times.system
        ep.close()
    except Exception as e:  # reported to the parent, never raised in the child
        result["error"] = f"{type(e).__name__}: {e}"
    conn.send(result)
    stop.wait(timeout)
    close_all(socks)


class MultiPublisher(Publisher):
    """A forked process publishing ``datas[i]`` on the already logged-in ``socks[i]``, all
    connections at once (one process: 100 forked publishers would fight the readers for the
    clients' core)."""

    def __init__(self, socks: list[socket.socket], datas: list[bytes], reply_bytes: list[int],
                 timeout: float):
        self.stop_event = _fork.Event()
        self.parent, child = _fork.Pipe(duplex=False)
        self.proc = _fork.Process(
            target=_multi_publisher_main,
            args=(socks, datas, reply_bytes, child, self.stop_event, timeout), daemon=True,
        )
        self.proc.start()
        close_all(socks)  # the child holds its own copies


def _windowed_main(sock, data, frame_len, window, ack_header, cycle, conn, stop, timeout) -> None:
    """Send the frames of ``data`` (all ``frame_len`` bytes) with at most ``window`` of them
    unacknowledged. The server answers only with cumulative acks: ``ack_header`` + u16 seq,
    the seq of the ``k``-th message being ``(k - 1) % cycle + 1``; only the last complete
    ack of a read matters. Done when every message is acknowledged."""
    #: window_full: how many times the publisher filled the window and had to wait for an ack
    result: dict = {"sent": 0, "replies": 0, "acks": 0, "window_full": 0, "error": None}
    try:
        sock.setblocking(False)
        view = memoryview(data)
        messages = len(data) // frame_len
        ack_len = len(ack_header) + 2
        sent = 0  # bytes
        acked = 0  # messages
        got = 0
        acks = 0
        full = 0
        pending = bytearray()
        rbuf = bytearray(1 << 16)
        ep = select.epoll()
        ep.register(sock.fileno(), select.EPOLLIN)
        want_out = False
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        while acked < messages and time.monotonic() < deadline:
            # send what the window allows (it fits an idle send buffer: rarely blocks)
            limit = min(messages, acked + window) * frame_len
            if sent < limit:
                with contextlib.suppress(BlockingIOError):
                    sent += sock.send(view[sent:limit])
                if sent == limit < len(data):
                    full += 1  # the window is full: wait for an ack
            blocked = sent < limit
            if blocked != want_out:
                want_out = blocked
                ep.modify(sock.fileno(), select.EPOLLIN | (select.EPOLLOUT if blocked else 0))
            events = ep.poll(0.2)
            if not events or not events[0][1] & select.EPOLLIN:
                continue
            try:
                n = sock.recv_into(rbuf)
            except BlockingIOError:
                continue
            if n == 0:
                result["error"] = "server closed the publisher's connection"
                break
            got += n
            pending += rbuf[:n]
            complete = len(pending) // ack_len * ack_len
            if not complete:
                continue
            acks += complete // ack_len
            last = bytes(pending[complete - ack_len : complete])
            del pending[:complete]
            if not last.startswith(ack_header):
                result["error"] = f"not an ack: {last!r}"
                break
            seq = int.from_bytes(last[-2:], "big")
            # steps from the oldest unacknowledged message to the acked one, across the wrap
            new = acked + (seq - (acked % cycle + 1)) % cycle + 1
            if new > sent // frame_len:
                result["error"] = (f"ack {seq} beyond what was sent ({sent // frame_len} "
                                   f"messages, {acked} acknowledged)")
                break
            acked = new
        result["send_seconds"] = time.perf_counter() - t0
        if acked < messages and not result["error"]:
            result["error"] = f"only {acked} of {messages} messages acknowledged in {timeout} s"
        result.update(sent=sent, replies=got, acks=acks, acked=acked, window_full=full)
        times = os.times()
        result["cpu_seconds"] = times.user + times.system
        ep.close()
    except Exception as e:  # reported to the parent, never raised in the child
        result["error"] = f"{type(e).__name__}: {e}"
    conn.send(result)
    stop.wait(timeout)
    sock.close()


class WindowedPublisher(Publisher):
    """A forked process publishing ``data`` (frames of ``frame_len`` bytes) on the already
    logged-in ``sock``, at most ``window`` messages unacknowledged (Micromessage2
    batch-ack): it sends up to the window, reads the server's cumulative acks
    (``ack_header`` + u16 seq, seqs going round 1..``cycle``), sends more."""

    def __init__(self, sock: socket.socket, data: bytes, frame_len: int, window: int,
                 ack_header: bytes, timeout: float, cycle: int = 0xFFFF):
        if len(data) % frame_len:
            raise ValueError("the frames must all be frame_len bytes")
        self._start(sock, _windowed_main,
                    (sock, data, frame_len, window, ack_header, cycle), timeout)


# -- echo: a child process that answers every message ------------------------------------


def _echo_ssmp(sock, peer: bytes, me: bytes, stop, deadline) -> int:
    prefix = b"000 %s UCAST %s " % (peer, me)
    reply = b"UCAST %s " % peer
    buf = b""
    echoed = 0
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        out = []
        for line in lines:
            if line.startswith(prefix):
                out.append(reply + line[len(prefix) :] + b"\n")
            elif line == b"000 . PING":
                out.append(b"PONG\n")
            elif line != b"200":
                raise BenchError(f"echo got unexpected {line[:80]!r}")
        if out:
            sock.sendall(b"".join(out))
            echoed += len(out)
    return echoed


def _echo_mqtt(sock, reply_topic: bytes, stop, deadline) -> int:
    buf = bytearray()
    echoed = 0
    topic = struct.pack("!H", len(reply_topic)) + reply_topic
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
        out = []
        for header, body in parse_mqtt_packets(buf):
            if header & 0xF0 == 0x30:
                (tlen,) = struct.unpack_from("!H", body)
                msg = topic + body[2 + tlen :]
                out.append(b"\x30" + _len_byte(len(msg)) + msg)
        if out:
            sock.sendall(b"".join(out))
            echoed += len(out)
    return echoed


def _len_byte(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _echo_main(sock, kind, args, conn, stop, timeout) -> None:
    result: dict = {"echoed": 0, "error": None}
    try:
        sock.settimeout(0.2)
        deadline = time.monotonic() + timeout
        if kind == "ssmp":
            result["echoed"] = _echo_ssmp(sock, *args, stop, deadline)
        else:
            result["echoed"] = _echo_mqtt(sock, *args, stop, deadline)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
    conn.send(result)
    with contextlib.suppress(OSError):
        sock.close()


class Echo:
    """A forked process echoing on the already logged-in/subscribed ``sock``."""

    def __init__(self, sock: socket.socket, kind: str, args: tuple, timeout: float):
        self.stop_event = _fork.Event()
        self.parent, child = _fork.Pipe(duplex=False)
        self.proc = _fork.Process(
            target=_echo_main, args=(sock, kind, args, child, self.stop_event, timeout),
            daemon=True,
        )
        self.proc.start()
        sock.close()

    def finish(self, timeout: float = 10.0) -> dict:
        self.stop_event.set()
        result: dict = {"error": "echo reported nothing"}
        if self.parent.poll(timeout):
            result = self.parent.recv()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5.0)
        return result
