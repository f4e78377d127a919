"""The sbus adapter of the interop matrix, written from the sbus README alone: a raw
``socket.socket(AF_UNIX, SOCK_SEQPACKET)`` and packets built by hand, never msgbroker's sbus
codec or client (the point is to check the server against an independent reading).

sbus differs from the other protocols in ways the matrix must know:

- there is no login: the broker names the connection ``sbus:<uid>:<pid>`` from its
  SO_PEERCRED credentials, so every sbus peer of this test process has the same identity;
- nothing is answered: a packet is followed by a *barrier* — a ``MSG`` to a private marker
  key the peer subscribed to on connect; it comes back once the broker handled every earlier
  packet of the connection (it handles them in order), and whatever the broker routed to
  the peer before is in the stream ahead of it;
- the marker key is secret (``!/cred/<gid>/<uid>/<pid>/interop-sync/<n>``, credentials
  from ``CMSG !/cred/whoami``): no empty or wildcard pattern, and no other protocol, ever
  sees it, so markers are invisible to every other subscriber. It comes back by echo, so
  a barrier needs echo on (``CMSG echo/off`` callers send ``echo/on`` before syncing);
- a delivered ``MSG`` does not say who sent it: its event's sender is :data:`UNKNOWN`; its
  topic is the key decoded with surrogateescape, which is lossless (docs/architecture.md,
  "Cross-protocol decisions"), so
  comparing events compares the key bytes;
- only MCASTs travel: no presence, unicast or broadcast.
"""

from __future__ import annotations

import itertools
import socket
import time
from typing import Any, ClassVar

from tests.interop.peers import WAIT, Closed, Event, Peer

#: the sender of a message as an sbus subscriber sees it: not said
UNKNOWN = ""
#: the largest packet the broker accepts by default (docs/sbus.md, Decisions); a recv
#: buffer one larger tells a whole packet from a truncated one
MAX_PACKET = 212_960

_markers = itertools.count(1)


def key_of(topic: str | bytes) -> bytes:
    """The routing key of ``topic``: bytes as they are, text as UTF-8 with surrogateescape
    (the broker's own mapping, docs/architecture.md)."""
    return topic if isinstance(topic, bytes) else topic.encode("utf-8", "surrogateescape")


class SbusPeer(Peer):
    name = "sbus"
    listener = "sbus"
    NOT_FOUND = None  # sbus has no unicast
    has_presence: ClassVar[bool] = False
    has_broadcast: ClassVar[bool] = False
    names_mcast_sender: ClassVar[bool] = False

    def __init__(self, address: str) -> None:
        """Connect to ``address`` (``unix:PATH``, as the broker reports its listener), ask
        for the connection's credentials and subscribe to the private marker key."""
        super().__init__(address)
        self.credentials = self._whoami()
        uid, pid = self.uid_pid
        self.identity = f"sbus:{uid}:{pid}"
        self._marker_key = b"%s/interop-sync/%d" % (self.credentials, next(_markers))
        self._barrier_seen: set[bytes] = set()
        self.send(b"SUB " + self._marker_key)
        self._barrier()

    def _connect(self, address: str) -> socket.socket:
        kind, _, path = address.partition(":")
        assert kind == "unix", f"not an sbus unix address: {address!r}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(WAIT)
        sock.connect(path)
        return sock

    def _whoami(self) -> bytes:
        """``!/cred/<gid>/<uid>/<pid>`` from the server's control message (the sbus README: the
        reply has the same key, so it is known to come from the server)."""
        self.send(b"CMSG !/cred/whoami")
        self.sock.settimeout(WAIT)
        packet = self.sock.recv(MAX_PACKET + 1)
        head, nul, credentials = packet.partition(b"\0")
        if head != b"CMSG !/cred/whoami" or not nul:
            raise AssertionError(f"unexpected answer to whoami: {packet!r}")
        return credentials

    @property
    def uid_pid(self) -> tuple[int, int]:
        _, uid, pid = self.credentials.removeprefix(b"!/cred/").split(b"/")[:3]
        return int(uid), int(pid)

    @classmethod
    def carries(cls, sender: str, topic: str | None, data: bytes) -> bool:
        """MCASTs only, on a topic that maps to a routing key (no NUL, no surrogate that
        surrogateescape does not map back to a byte); any payload."""
        if topic is None:
            return False
        try:
            return b"\0" not in topic.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return False

    # -- requests ------------------------------------------------------------------------------

    def send(self, packet: bytes) -> None:
        """One packet, as it is (a test may send any control message or a bad one)."""
        self.sock.settimeout(WAIT)
        self.sock.send(packet)

    def login(self, identity: str) -> None:
        raise NotImplementedError("sbus has no login: the broker names the connection")

    def subscribe(self, topic: str | bytes, presence: bool = False) -> None:
        """``SUB pattern``; in effect once this returns."""
        assert not presence, "sbus has no presence"
        self.send(b"SUB " + key_of(topic))
        self._barrier()

    def unsubscribe(self, topic: str | bytes) -> None:
        self.send(b"UNSUB " + key_of(topic))
        self._barrier()

    def publish(self, topic: str | bytes, data: bytes) -> None:
        """``MSG key\\0data``; handled (routed everywhere) once this returns."""
        self.send(b"MSG " + key_of(topic) + b"\0" + data)
        self._barrier()

    def publish_many(self, topic: str | bytes, items: list[bytes]) -> None:
        """Every item back to back, one packet each, then one barrier."""
        key = key_of(topic)
        for data in items:
            self.send(b"MSG " + key + b"\0" + data)
        self._barrier()

    def publish_and_close(self, topic: str | bytes, data: bytes) -> None:
        self.send(b"MSG " + key_of(topic) + b"\0" + data)
        self.close()

    def control(self, key: bytes) -> None:
        """``CMSG key`` (echo/off, echo/on, flood control): in effect once this returns.
        No barrier when it turns echo off: the marker would not come back."""
        self.send(b"CMSG " + key)
        if key != b"echo/off":
            self._barrier()

    def unicast(self, to: str, data: bytes) -> None:
        raise NotImplementedError("sbus has no unicast")

    def broadcast(self, data: bytes) -> None:
        raise NotImplementedError("sbus has no broadcast")

    def _call(self, requests: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError("sbus requests are packets: see send()")

    # -- sync ----------------------------------------------------------------------------------

    def _barrier(self) -> None:
        """Publish a marker to the private key and wait for it; events that arrive
        meanwhile stay queued, in order."""
        marker = b"sbus-barrier-%d" % next(_markers)
        self.send(b"MSG " + self._marker_key + b"\0" + marker)
        deadline = time.monotonic() + WAIT
        while marker not in self._barrier_seen:
            self._read(deadline, "the barrier")
        self._barrier_seen.discard(marker)

    def sync(self) -> list[Event]:
        """Every event that arrived before a barrier."""
        self._barrier()
        events = list(self._events)
        self._events.clear()
        return events

    # -- input ---------------------------------------------------------------------------------

    def _read(self, deadline: float, what: str) -> None:
        """One packet (SOCK_SEQPACKET: one recv is one whole packet)."""
        if self.closed:
            raise Closed(f"connection closed while waiting for {what}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"sbus: no {what} within {WAIT} s")
        self.sock.settimeout(remaining)
        try:
            packet = self.sock.recv(MAX_PACKET + 1)
        except TimeoutError:
            raise TimeoutError(f"sbus: no {what} in time") from None
        except ConnectionResetError:
            packet = b""
        if not packet:
            self.closed = True
            self.sock.close()
            raise Closed(f"connection closed while waiting for {what}")
        self._feed(packet)

    def _feed(self, packet: bytes) -> None:
        assert len(packet) <= MAX_PACKET, "a packet over the maximum (or truncated)"
        if not packet.startswith(b"MSG "):
            raise AssertionError(f"the server sent an unexpected packet: {packet[:80]!r}")
        key, nul, data = packet[4:].partition(b"\0")
        assert nul, f"MSG without a NUL: {packet[:80]!r}"
        if key == self._marker_key:
            self._barrier_seen.add(data)
            return
        self._events.append(Event(UNKNOWN, "mcast", key.decode("utf-8", "surrogateescape"), data))
