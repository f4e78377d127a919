"""Several packets to one seqpacket socket in one system call: ``sendmmsg(2)`` through
ctypes (Python's socket module has no ``sendmmsg``). No Twisted here.

Why: on this kind of machine a system call costs about as much as the kernel's work for a
small packet, so a subscriber that receives a read slice's worth of packets (a publisher's
burst, or every recipient of a fan-out) as one ``sendmmsg`` costs the broker well under
what as many ``send`` calls cost (bench/README.md, "sbus against the C reference"). The
packets are joined into one buffer, and one ``iovec`` per packet points into it.

:func:`sender` gives a ``send_packets(fd, packets) -> int`` for the platform, or None when
there is no ``sendmmsg`` (not Linux, or no C library that has it): the caller then sends
packet by packet.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable, Sequence

#: the most packets one call takes (a longer list is sent in several calls)
BATCH = 256
#: MSG_DONTWAIT | MSG_NOSIGNAL: never block the reactor; a gone peer is EPIPE, no signal
_FLAGS = 0x40 | 0x4000

SendPackets = Callable[[int, Sequence[bytes]], int]


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_sender: SendPackets | None = None
_looked = False
#: the arrays the sender's system calls point into
_buffers: list[tuple[ctypes.Array[_Iovec], ctypes.Array[_Mmsghdr]]] = []


def sender() -> SendPackets | None:
    """The ``send_packets`` of this platform (made once), or None without ``sendmmsg``."""
    global _sender, _looked
    if not _looked:
        _looked = True
        _sender = _make_sender()
    return _sender


def _make_sender() -> SendPackets | None:
    if not hasattr(os, "sched_getaffinity"):  # not Linux
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        sendmmsg = libc.sendmmsg
    except (OSError, AttributeError):
        return None
    sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    sendmmsg.restype = ctypes.c_int
    # one iovec per packet, each message pointing at its own, made once: a call only
    # rewrites the iovecs (one struct.pack_into for them all)
    iovecs = (_Iovec * BATCH)()
    messages = (_Mmsghdr * BATCH)()
    for i in range(BATCH):
        messages[i].msg_hdr.msg_iov = ctypes.pointer(iovecs[i])
        messages[i].msg_hdr.msg_iovlen = 1
    iovec_bytes = memoryview(iovecs).cast("B")
    address = ctypes.addressof(messages)
    _buffers.append((iovecs, messages))  # alive as long as the module: ``address`` is theirs
    layouts = [struct.Struct("=" + "QQ" * n) for n in range(BATCH + 1)]
    get_errno = ctypes.get_errno
    char_p, void_p, cast = ctypes.c_char_p, ctypes.c_void_p, ctypes.cast

    def send_packets(fd: int, packets: Sequence[bytes]) -> int:
        """Send ``packets`` in order on the non-blocking seqpacket socket ``fd``: how many
        went (fewer when the socket filled up). BlockingIOError when not even the first
        fits; OSError for an error before the first."""
        sent = 0
        total = len(packets)
        while sent < total:
            chunk = packets[sent : sent + BATCH]
            count = len(chunk)
            data = b"".join(chunk)  # alive until the call returns
            at: int = cast(char_p(data), void_p).value  # type: ignore[assignment]
            fields: list[int] = []
            for packet in chunk:
                size = len(packet)
                fields += (at, size)
                at += size
            layouts[count].pack_into(iovec_bytes, 0, *fields)
            done = sendmmsg(fd, address, count, _FLAGS)
            if done < 0:
                code = get_errno()
                if code == errno.EINTR:
                    continue
                if sent:
                    return sent  # the error shows again on the next send
                if code in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise BlockingIOError(code, os.strerror(code))
                raise OSError(code, os.strerror(code))
            sent += done
            if done < count:
                break  # full
        return sent

    return send_packets
