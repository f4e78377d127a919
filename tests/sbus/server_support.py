"""A real broker with an sbus listener, and raw seqpacket clients written from the sbus
README (no msgbroker client code), for the server tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

from attrs import define, field

from tests.ssmp.e2e_support import WAIT, RunningBroker, running_broker

MAX = 212_961  # one byte more than the default maximum packet


@define
class RawClient:
    """A blocking seqpacket client; every receive waits at most ``WAIT`` seconds."""

    sock: socket.socket

    def send(self, packet: bytes) -> None:
        self.sock.send(packet)

    def recv(self, timeout: float = WAIT) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(MAX)

    def expect(self, *packets: bytes) -> None:
        for packet in packets:
            assert self.recv() == packet

    def sync(self) -> list[bytes]:
        """Everything routed to this client before the answer to a ``!/cred/whoami`` it
        asks now: the broker routes synchronously and answers in order, so this proves
        absence without waiting (after the publisher's own :meth:`sync`, for what it sent)."""
        self.send(b"CMSG !/cred/whoami")
        got = []
        while not (packet := self.recv()).startswith(b"CMSG !/cred/whoami\0"):
            got.append(packet)
        return got

    def closed_by_server(self) -> bool:
        """Whether the server closed this connection (reads what is left until the end)."""
        self.sock.settimeout(WAIT)
        try:
            while self.sock.recv(MAX):
                pass
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


@define
class Bus:
    broker: RunningBroker
    path: str
    clients: list[RawClient] = field(factory=list)

    def client(self, rcvbuf: int | None = None) -> RawClient:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(WAIT)
        sock.connect(self.path)
        c = RawClient(sock)
        self.clients.append(c)
        return c

    def ssmp(self, identity: str) -> Any:
        """A raw SSMP client logged in as ``identity`` (a socket file for lines)."""
        sock = socket.create_connection((self.broker.host, self.broker.port), timeout=WAIT)
        reader = sock.makefile("rb")
        sock.sendall(b"LOGIN %s open\n" % identity.encode())
        assert reader.readline() == b"200\n"
        return sock, reader

    @property
    def hub(self) -> Any:
        return self.broker.service.broker.hub


@contextlib.contextmanager
def running_bus(options: str = "", **config: Any) -> Iterator[Bus]:
    """A broker with SSMP and sbus listeners; ``options`` go after the sbus address
    (``:max-packet=1024``); ``config`` are further :class:`BrokerConfig` fields."""
    directory = tempfile.mkdtemp(prefix="sbus", dir="/tmp")
    path = os.path.join(directory, "bus")
    try:
        with running_broker(
            ("ssmp=tcp:0:interface=127.0.0.1", f"sbus=unix:{path}{options}"),
            auth=config.pop("auth", ("open",)),
            **config,
        ) as broker:
            bus = Bus(broker, path)
            try:
                yield bus
            finally:
                for c in bus.clients:
                    c.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
