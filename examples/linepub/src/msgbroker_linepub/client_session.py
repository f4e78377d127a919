"""The linepub client session: sans-IO, on msgbroker's client kit. It turns requests into
lines and lines into answers and deliveries; the Twisted client (client.py) and the
blocking client (blocking.py) drive it over a socket, the kit doing the socket, TLS and
deadline loop."""

from __future__ import annotations

from collections import deque
from typing import Any

from attrs import frozen

from msgbroker.clientkit.session import ClientSession, ConnectionClosed
from msgbroker.errors import RemoteProtocolError

from . import codec

DEFAULT_PORT = 4450


class LinepubError(Exception):
    """The broker answered ``NO <reason>``."""


class LinepubClosed(ConnectionClosed):
    """The connection ended."""


@frozen
class Delivery:
    topic: str
    sender: str
    text: str


class LinepubSession(ClientSession):
    """Requests are answered in order (``OK``, ``NO reason``, ``PONG``); ``MSG`` lines are
    deliveries, ``MOTD`` is kept, and the broker's ``PING`` is answered at once."""

    closed_error = LinepubClosed

    def __init__(self, identity: str, scheme: str, credential: bytes | None) -> None:
        super().__init__()
        self.motd: str | None = None
        self._waiting: deque[int] = deque()
        self._buffer = b""
        self._hello = codec.Hello(identity, scheme, credential)

    def _started(self, now: float) -> None:
        self.login = self._request(self._hello)

    def request(self, request: codec.Request) -> int:
        self.check_open()
        return self._request(request)

    def _request(self, request: codec.Request) -> int:
        token = self._token()
        self._waiting.append(token)
        self._send(codec.encode_request(request))
        return token

    def _received(self, data: Any, now: float) -> None:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            reply = codec.parse_reply(line)
            if reply.kind == "MSG":
                self._emit(Delivery(*reply.fields))
            elif reply.kind == "MOTD":
                self.motd = reply.fields[0]
            elif reply.kind == "PING":
                self._send(b"PING\n")  # its PONG answers nobody: a token of its own
                self._waiting.append(self._token())
            elif reply.kind == "ERR":
                raise RemoteProtocolError(reply.fields[0])
            elif not self._waiting:
                raise RemoteProtocolError(f"an answer nobody asked for: {line!r}")
            elif reply.kind == "NO":
                self._fail(self._waiting.popleft(), LinepubError(reply.fields[0]))
            else:
                self._answer(self._waiting.popleft())
