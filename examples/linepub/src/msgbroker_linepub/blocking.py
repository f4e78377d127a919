"""The blocking linepub client: the kit's blocking driver running :class:`LinepubSession`
over a socket (for scripts and the ``msgbroker linepub`` command)."""

from __future__ import annotations

from collections import deque
from typing import Any

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp

from . import codec
from .client_session import DEFAULT_PORT, Delivery, LinepubSession


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
