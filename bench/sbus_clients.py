"""sbus clients for the benchmark harness (bench/sbus.py runs them): raw
``socket.socket(AF_UNIX, SOCK_SEQPACKET)`` sockets, blocking, the readers and the publisher
each in a forked process (on the clients' core, like the other protocols' publishers).

Every packet is one message: a publisher ``send``s pre-built ``MSG bench\\0<payload>``
packets one by one (a send blocks while the broker is behind, so the publisher is
flow-controlled by the broker's reading), a reader ``recv_into``s one packet per call.
Waits are kernel timeouts (``SO_RCVTIMEO``/``SO_SNDTIMEO``) on blocking sockets: a packet
costs one system call, never a ``poll`` first, and no wait is unbounded.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import re
import select
import socket
import struct
import time

from clients import BenchError

KEY = b"bench"
PREFIX = b"MSG " + KEY + b"\0"
WHOAMI = b"CMSG !/cred/whoami"
#: the same clock in every process (CLOCK_MONOTONIC), so the readers' times compare
clock = time.monotonic
_fork = multiprocessing.get_context("fork")


def _kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Blocking socket, with the timeout in the kernel: a recv/send that waits longer fails
    with EAGAIN (BlockingIOError), and a packet costs one system call."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def connect(path: str, timeout: float, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect(path)
        _kernel_timeouts(sock, timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def subscriber(
    path: str,
    timeout: float,
    controls: tuple[bytes, ...] = (),
    rcvbuf: int | None = None,
    keys: tuple[bytes, ...] = (KEY,),
) -> socket.socket:
    """A client that sent ``SUB`` each of ``keys`` (and ``CMSG`` each of ``controls``), once
    the broker has handled it: the answer to a whoami sent after it has arrived."""
    sock = connect(path, timeout, rcvbuf)
    try:
        for key in keys:
            sock.send(b"SUB " + key)
        for control in controls:
            sock.send(b"CMSG " + control)
        sock.send(WHOAMI)
        _whoami_answer(sock, timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def _whoami_answer(sock: socket.socket, timeout: float) -> None:
    try:
        answer = sock.recv(4096)
    except BlockingIOError:
        raise BenchError(f"no answer to {WHOAMI!r} in {timeout} s") from None
    if not answer.startswith(WHOAMI + b"\0"):
        raise BenchError(f"{WHOAMI!r} answered {answer!r}")


class Child:
    """A forked process running ``target(*args, conn)`` on ``sock`` (closed here: the child
    has its own copy); :meth:`finish` returns what it sent on ``conn``."""

    def __init__(self, target, args: tuple, sock: socket.socket) -> None:
        self.parent, child = _fork.Pipe(duplex=False)
        self.proc = _fork.Process(target=target, args=(*args, child), daemon=True)
        self.proc.start()
        child.close()  # so that a child dying without a report is an EOF here
        sock.close()

    def finish(self, timeout: float) -> dict:
        result: dict = {"error": "reported nothing"}
        with contextlib.suppress(EOFError, OSError):
            if self.parent.poll(timeout):
                result = self.parent.recv()
        self.proc.join(5.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5.0)
        return result


def reader_main(sock, n: int, plen: int, checks: list, timeout: float, batch: int, conn) -> None:
    """Receive until ``n`` packets arrived, one per ``recv_into`` (``batch`` > 1: up to that
    many per ``recvmmsg``); check every length, and the packets ``checks`` lists
    (``(count, expected packet)``, ascending) byte for byte."""
    if batch > 1:
        _batched_reader(sock, n, plen, checks, timeout, batch, conn)
        return
    result: dict = {
        "count": 0,
        "t_first": None,
        "t_last": None,
        "error": None,
        "bad_length": 0,
        "wrong": None,
        "extra": False,
    }
    count = bad_length = 0
    try:
        buf = bytearray(max(1 << 16, 2 * plen))
        recv_into = sock.recv_into
        pending = iter(checks)
        at, want = next(pending, (0, b""))
        k = recv_into(buf)
        result["t_first"] = clock()
        while True:
            if k == 0:
                result["error"] = f"end of stream after {count} packets"
                break
            count += 1
            if k != plen:
                bad_length += 1
            if count == at:
                if buf[:k] != want and result["wrong"] is None:
                    result["wrong"] = f"packet {count}: {bytes(buf[:k][:80])!r} != {want[:80]!r}"
                at, want = next(pending, (0, b""))
            if count >= n:
                result["t_last"] = clock()
                break
            k = recv_into(buf)
        if count >= n:  # nothing beyond the n (a duplicate would be waiting by now)
            with contextlib.suppress(BlockingIOError):
                result["extra"] = bool(sock.recv(plen + 1, socket.MSG_DONTWAIT))
    except BlockingIOError:
        result["error"] = f"no packet for {timeout} s after {count} packets"
    except OSError as e:
        result["error"] = f"after {count} packets: {e.strerror or e}"
    result["count"] = count
    result["bad_length"] = bad_length
    times = os.times()
    result["cpu_seconds"] = times.user + times.system
    conn.send(result)
    sock.close()


def publisher_main(sock, data: bytes, plen: int, timeout: float, batch: int, conn) -> None:
    """Send ``data`` as packets of ``plen`` bytes, each ``send`` one packet (``batch`` > 1:
    up to that many per ``sendmmsg``); then a whoami, and wait for its answer before closing.

    The whoami: a server handles a client's packets in order, so once it answers, it has
    read every packet sent before it. The C reference sbusd drops what it has not read
    yet when a client hangs up (it removes the client on EPOLLRDHUP), so a publisher that
    closed right after its last send would lose its last few hundred packets there."""
    result: dict = {"sent": 0, "error": None}
    view = memoryview(data)
    send = sock.send
    offset = 0
    t0 = clock()
    try:
        if batch > 1:
            _send_batched(sock, data, plen, batch)
        else:
            for offset in range(0, len(data), plen):
                send(view[offset : offset + plen])
        offset = len(data)
        result["send_seconds"] = clock() - t0
        send(WHOAMI)
        _whoami_answer(sock, timeout)
    except BlockingIOError:
        result["error"] = f"a send blocked for {timeout} s after {offset // plen} packets"
    except (OSError, BenchError) as e:
        result["error"] = f"after {offset // plen} packets: {getattr(e, 'strerror', None) or e}"
    result["sent"] = offset // plen
    result.setdefault("send_seconds", clock() - t0)
    times = os.times()
    result["cpu_seconds"] = times.user + times.system
    conn.send(result)
    sock.close()  # what it sent is still delivered (DECISIONS.md)


def hung_up(sock: socket.socket, wait: float) -> bool:
    """Whether the broker closed ``sock`` (within ``wait`` s: a close during the run has
    reached us by then). Queued packets are still readable after a close: poll for HUP."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)
    events = poller.poll(int(wait * 1000))
    return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in events)


def drain(sock: socket.socket, idle: float = 0.5, limit: float = 60.0) -> tuple[int, str]:
    """Read what the stalled client was sent until the end of the stream, ``idle`` s without
    a packet, or ``limit`` s: (packets, how it ended)."""
    _kernel_timeouts(sock, idle)
    buf = bytearray(1 << 16)
    count = 0
    end = time.monotonic() + limit
    try:
        while time.monotonic() < end:
            if not sock.recv_into(buf):
                return count, "end of stream"
            count += 1
    except BlockingIOError:
        return count, f"nothing more for {idle} s"
    except OSError as e:
        return count, str(e.strerror or e)
    return count, f"still sending after {limit} s"


def wait_listening(proc, log, line: bytes, path: str, timeout: float, what: str) -> None:
    """Wait for ``line`` in the server's ``log`` (a file has nothing to wait on but
    polling), then connect once to ``path``: the socket really accepts."""
    pattern = re.compile(re.escape(line))
    deadline = time.monotonic() + timeout
    while not pattern.search(log.read_bytes()):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-500:]
            raise RuntimeError(f"{what} did not start listening ({log}): {tail}")
        time.sleep(0.05)
    connect(path, timeout).close()


# -- batched clients (--sbus-batch N): recvmmsg/sendmmsg through ctypes --------------------
#
# One Python system call per packet costs the clients' core about what the server spends
# per delivery, so with one reader and one publisher on it the clients, not the server,
# may set the pace (see bench/README.md, "sbus against the C reference"). These move up to
# N packets per call; blocking sockets and kernel timeouts as above.

_MSG_WAITFORONE = 0x10000


def _mmsg_arrays(count: int, slot: int):
    """``count`` mmsghdrs, each with one iovec; with ``slot`` > 0, each iovec points to its
    own ``slot`` bytes of one receive buffer."""
    import ctypes

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    class Msghdr(ctypes.Structure):
        _fields_ = [
            ("name", ctypes.c_void_p),
            ("namelen", ctypes.c_uint32),
            ("iov", ctypes.POINTER(Iovec)),
            ("iovlen", ctypes.c_size_t),
            ("control", ctypes.c_void_p),
            ("controllen", ctypes.c_size_t),
            ("flags", ctypes.c_int),
        ]

    class Mmsghdr(ctypes.Structure):
        _fields_ = [("hdr", Msghdr), ("len", ctypes.c_uint)]

    iovecs = (Iovec * count)()
    msgs = (Mmsghdr * count)()
    buf = (ctypes.c_char * (count * max(slot, 1)))()
    for i in range(count):
        msgs[i].hdr.iov = ctypes.pointer(iovecs[i])
        msgs[i].hdr.iovlen = 1
        if slot:
            iovecs[i].base = ctypes.addressof(buf) + i * slot
            iovecs[i].len = slot
    libc = ctypes.CDLL(None, use_errno=True)
    return libc, iovecs, msgs, buf, ctypes.sizeof(Mmsghdr)


def _batched_reader(sock, n, plen, checks, timeout, batch, conn) -> None:
    import ctypes

    result: dict = {
        "count": 0,
        "t_first": None,
        "t_last": None,
        "error": None,
        "bad_length": 0,
        "wrong": None,
        "extra": False,
    }
    slot = plen + 1  # a longer packet shows as one byte too long
    libc, _iovecs, msgs, buf, hdr = _mmsg_arrays(batch, slot)
    recvmmsg = libc.recvmmsg
    recvmmsg.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    fd, address = sock.fileno(), ctypes.addressof(msgs)
    # each mmsghdr's msg_len, as uint32s: the last field of each
    lengths = memoryview(msgs).cast("B").cast("I")
    first, stride = hdr // 4 - 2, hdr // 4
    data = memoryview(buf)
    count = bad_length = 0
    pending = iter(checks)
    at, want = next(pending, (0, b""))
    try:
        while count < n:
            got = recvmmsg(fd, address, min(batch, n - count), _MSG_WAITFORONE, None)
            if got < 0:
                code = ctypes.get_errno()
                if code == errno.EINTR:
                    continue
                _raise_errno(code)
            if result["t_first"] is None:
                result["t_first"] = clock()
            sizes = lengths[first : first + stride * got : stride].tolist()
            if 0 in sizes:  # the end of the stream
                count += sizes.index(0)
                result["error"] = f"end of stream after {count} packets"
                break
            bad_length += got - sizes.count(plen)
            while at and at <= count + got:
                i = at - count - 1
                packet = bytes(data[i * slot : i * slot + sizes[i]])
                if packet != want and result["wrong"] is None:
                    result["wrong"] = f"packet {at}: {packet[:80]!r} != {want[:80]!r}"
                at, want = next(pending, (0, b""))
            count += got
        if count >= n:
            result["t_last"] = clock()
            with contextlib.suppress(BlockingIOError):
                result["extra"] = bool(sock.recv(plen + 1, socket.MSG_DONTWAIT))
    except BlockingIOError:
        result["error"] = f"no packet for {timeout} s after {count} packets"
    except OSError as e:
        result["error"] = f"after {count} packets: {e.strerror or e}"
    result["count"] = count
    result["bad_length"] = bad_length
    times = os.times()
    result["cpu_seconds"] = times.user + times.system
    conn.send(result)
    sock.close()


def _send_batched(sock, data: bytes, plen: int, batch: int) -> None:
    """Send ``data`` as packets of ``plen`` bytes, up to ``batch`` per ``sendmmsg`` (it
    blocks while the server is behind); BlockingIOError after the kernel timeout."""
    import ctypes

    libc, iovecs, msgs, _buf, _hdr = _mmsg_arrays(batch, 0)
    sendmmsg = libc.sendmmsg
    sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    keep = ctypes.create_string_buffer(data, len(data))  # an address for the iovecs
    base = ctypes.addressof(keep)
    fd, address = sock.fileno(), ctypes.addressof(msgs)
    total = len(data) // plen
    sent = 0
    while sent < total:
        count = min(batch, total - sent)
        for i in range(count):
            iovecs[i].base = base + (sent + i) * plen
            iovecs[i].len = plen
        done = sendmmsg(fd, address, count, 0)
        if done < 0:
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            _raise_errno(code)
        sent += done


def _raise_errno(code: int) -> None:
    """A system call's error as socket methods raise it (EAGAIN: the kernel timeout)."""
    if code in (errno.EAGAIN, errno.EWOULDBLOCK):
        raise BlockingIOError(code, os.strerror(code))
    raise OSError(code, os.strerror(code))
