"""The Twisted linepub client: the kit's stream driver running :class:`LinepubSession`.

    client = yield connect(reactor, "127.0.0.1", 4450, identity="alice",
                           on_message=lambda d: print(d.topic, d.text))
    yield client.subscribe("news")
    yield client.publish("news", "hello")   # fires once the broker answered OK
    yield client.close()

Each request returns a Deferred that fires on ``OK`` and fails with :class:`LinepubError`
on ``NO``; the kit fails what is pending when the connection ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from msgbroker.clientkit.protocol import (
    ClientFactory,
    StreamClientProtocol,
    client_endpoint,
    connect_client,
)

from . import codec
from .blocking import BlockingLinepubClient
from .client_session import DEFAULT_PORT, Delivery, LinepubClosed, LinepubError, LinepubSession

__all__ = [
    "DEFAULT_PORT",
    "BlockingLinepubClient",
    "Delivery",
    "LinepubClient",
    "LinepubClosed",
    "LinepubError",
    "LinepubSession",
    "connect",
]


class LinepubClient(StreamClientProtocol):
    """A linepub connection; deliveries go to :meth:`on_message` (override it, or pass
    ``on_message=`` to the constructor)."""

    log = Logger(namespace="msgbroker_linepub.client")
    client_name = "linepub client"
    session: LinepubSession

    def __init__(
        self,
        identity: str,
        scheme: str = "open",
        credential: bytes | None = None,
        clock: Any = None,
        on_message: Callable[[Delivery], object] | None = None,
    ) -> None:
        super().__init__(LinepubSession(identity, scheme, credential), clock)
        self._use_handlers(on_message=on_message)

    def on_message(self, delivery: Delivery) -> None:
        """A message published to a topic this client subscribed to."""

    def when_logged_in(self) -> defer.Deferred[Any]:
        return self._request(lambda: self.session.login)

    def subscribe(self, topic: str) -> defer.Deferred[Any]:
        return self._request(lambda: self.session.request(codec.Sub(topic)))

    def publish(self, topic: str, text: str) -> defer.Deferred[Any]:
        return self._request(lambda: self.session.request(codec.Pub(topic, text)))

    def _dispatch(self, event: Any) -> None:
        self._deliver(self.on_message, event)


def connect(
    reactor: Any,
    host: str,
    port: int = DEFAULT_PORT,
    *,
    identity: str,
    scheme: str = "open",
    credential: bytes | None = None,
    tls: Any = None,
    on_message: Callable[[Delivery], object] | None = None,
) -> defer.Deferred[Any]:
    """Connect and log in; a Deferred of the logged-in :class:`LinepubClient`."""
    endpoint = client_endpoint(reactor, host, port, tls=tls)
    factory = ClientFactory(
        LinepubClient,
        identity=identity,
        scheme=scheme,
        credential=credential,
        clock=reactor,
        on_message=on_message,
    )
    return connect_client(endpoint, factory, lambda client: client.when_logged_in())
