"""TCP keepalive, for protocols without a heartbeat of their own (Micromessage2).

Such a protocol defines no ping, and a healthy peer may send nothing for hours (a
Micromessage2 subscriber without an ack window never has to), so silence proves nothing
and the broker cannot close an idle connection. A peer that vanished (power loss, a cable
pulled, a NAT that forgot the flow) sends no FIN either, so without help its connection,
identity and subscriptions would stay forever. The kernel can ask for us: with
``SO_KEEPALIVE`` it sends an empty probe after ``TCP_KEEPIDLE`` seconds of silence, every
``TCP_KEEPINTVL`` seconds, and resets the connection after ``TCP_KEEPCNT`` unanswered ones;
a live peer's kernel answers them whatever its application does. The connection is then
lost like any other, and the broker cleans up as for a close.

A server session says it has no heartbeat (``ServerSession.heartbeat = False``); the stream
glue (:class:`msgbroker.connection.StreamProtocol`) then calls :func:`set_tcp_keepalive`.
:func:`keepalive_probes` turns the broker's ``keepalive`` (the silence after which the
other protocols ping, and as long again before they give up) into those three settings, so
that a dead peer is found on the same schedule: first probe after ``keepalive`` s, reset
about ``keepalive`` s later. :func:`set_tcp_keepalive` applies them to the socket under a
Twisted transport, through TLS (the TLS layer is a protocol wrapper over the TCP
transport).
"""

from __future__ import annotations

import contextlib
import math
import socket
from typing import Any

#: unanswered probes before the kernel resets the connection
PROBES = 3
#: Linux's bounds on TCP_KEEPIDLE and TCP_KEEPINTVL (MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL)
_MAX_SECONDS = 32767


def keepalive_probes(interval: float) -> tuple[int, int, int]:
    """(idle, probe interval, probe count), whole seconds as the socket options take them:
    the first probe after ``interval`` s of silence, and the connection reset when
    :data:`PROBES` probes over about ``interval`` s more got no answer."""
    idle = min(_MAX_SECONDS, max(1, math.ceil(interval)))
    every = min(_MAX_SECONDS, max(1, math.ceil(interval / PROBES)))
    return idle, every, PROBES


def tcp_socket(transport: Any) -> socket.socket | None:
    """The TCP socket under ``transport`` (a TCP transport, or a TLS wrapper over one);
    None for anything else (a unix socket, an in-memory test transport)."""
    for _ in range(4):  # TLS over TCP is two levels; stop at any depth without a socket
        if transport is None:
            return None
        # vars(), not getattr: a protocol wrapper (TLS) forwards unknown attributes to the
        # transport under it, which would hide where the socket really is
        sock = vars(transport).get("socket") if hasattr(transport, "__dict__") else None
        if isinstance(sock, socket.socket):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                return sock
            return None
        transport = vars(transport).get("transport") if hasattr(transport, "__dict__") else None
    return None


def set_tcp_keepalive(transport: Any, interval: float) -> bool:
    """Turn TCP keepalive on for the socket under ``transport`` with
    :func:`keepalive_probes` ``(interval)``; False when there is no TCP socket. Options the
    platform lacks are left at its defaults (``SO_KEEPALIVE`` alone still finds a dead
    peer, after about two hours on Linux)."""
    sock = tcp_socket(transport)
    if sock is None:
        return False
    idle, every, count = keepalive_probes(interval)
    # macOS names the idle time TCP_KEEPALIVE
    idle_option = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))
    options = (
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, idle_option, idle),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), every),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), count),
    )
    for level, option, value in options:
        if option is not None:
            with contextlib.suppress(OSError):  # the peer may already be gone
                sock.setsockopt(level, option, value)
    return True
