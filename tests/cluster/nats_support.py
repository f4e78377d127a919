"""A blocking NATS client for the tests, on the engine's own sans-IO codec: to look at
the subjects the engine uses and to write garbage onto them."""

from __future__ import annotations

import socket
from typing import Any

from msgbroker.plugins.nats import codec
from tests.cluster.servers import WAIT, NatsServer


class RawNats:
    def __init__(self, server: NatsServer, **options: Any) -> None:
        self.sock: socket.socket = server.connect()
        self.sock.settimeout(WAIT)
        self.parser = codec.Parser()
        self.events: list[Any] = []
        self.messages: list[codec.Msg] = []
        info = self._next()
        assert isinstance(info, codec.Info), info
        if server.user is not None:
            options = {"user": server.user, "pass": server.password, **options}
        self.sock.sendall(codec.connect({"verbose": False, "pedantic": False, **options}))
        self.sync()

    def _next(self) -> Any:
        while not self.events:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by nats-server")
            self.events += self.parser.feed(data)
        return self.events.pop(0)

    def sync(self) -> None:
        """PING, and wait for the PONG: the server has handled what was sent before."""
        self.sock.sendall(codec.PING)
        while not isinstance(event := self._next(), codec.Pong):
            if isinstance(event, codec.Msg):
                self.messages.append(event)
            elif isinstance(event, codec.Err):
                raise ConnectionError(event.text)

    def sub(self, subject: bytes, sid: int = 1) -> None:
        self.sock.sendall(codec.sub(subject, sid))
        self.sync()

    def pub(self, subject: bytes, payload: bytes, reply: bytes | None = None) -> None:
        self.sock.sendall(codec.pub(subject, payload, reply))

    def next_msg(self) -> codec.Msg:
        if self.messages:
            return self.messages.pop(0)
        while not isinstance(event := self._next(), codec.Msg):
            if isinstance(event, codec.Ping):
                self.sock.sendall(codec.PONG)
        return event

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawNats:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
