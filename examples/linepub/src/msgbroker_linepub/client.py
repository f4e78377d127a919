"""The linepub client: a small sans-IO session on msgbroker's client kit, and a blocking
client that drives it over a socket (the kit does the socket, TLS and deadline loop)."""

from __future__ import annotations

from collections import deque
from typing import Any

from attrs import frozen

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp
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


class BlockingLinepubClient(BlockingClient):
    """``with BlockingLinepubClient(host, port, "alice", "token", b"...") as c:
    c.subscribe("news"); c.publish("news", "hi"); c.next_delivery()``."""

    session: LinepubSession
    peer = "broker"

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        identity: str = "anonymous",
        scheme: str = "open",
        credential: bytes | None = None,
        *,
        ssl_context: Any = None,
        timeout: float = 10.0,
    ) -> None:
        self.deliveries: deque[Delivery] = deque()
        sock = open_tcp(host, port, timeout=timeout, ssl_context=ssl_context)
        super().__init__(LinepubSession(identity, scheme, credential), StreamChannel(sock),
                         timeout=timeout)  # fmt: skip
        self._wait(self.session.login, timeout, "login answer")

    def subscribe(self, topic: str) -> None:
        self._wait(self.session.request(codec.Sub(topic)), self.timeout)

    def publish(self, topic: str, text: str) -> None:
        self._wait(self.session.request(codec.Pub(topic, text)), self.timeout)

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        delivery: Delivery | None = self._next(self.deliveries, timeout)
        return delivery

    def _event(self, event: Any) -> None:
        self.deliveries.append(event)

    def _goodbye(self) -> None:
        self.session.request(codec.Bye())
        self._flush()
