"""SSMP 1.1 clients: a Twisted protocol and a small blocking client, both on the sans-IO
codec (:mod:`msgbroker.plugins.ssmp.codec`).

Twisted::

    proto = yield connect(reactor, "127.0.0.1", 4444, identity="alice",
                          on_message=lambda d: print(d.sender, d.to, d.payload))
    yield proto.subscribe("news")
    yield proto.mcast("news", b"hello")          # fires once the broker answered 200
    yield proto.close()

Blocking::

    with BlockingSSMPClient("127.0.0.1", 4444, "alice") as client:
        client.subscribe("news")
        event = client.next_event(timeout=5)       # a Delivery or Presence, or None

Requests are answered in order, so replies are matched to requests first in, first out. A
reply other than ``200`` is an :class:`SSMPError`. Both clients answer the server's
``PING`` with ``PONG``, send their own ``PING`` after ``keepalive`` seconds without hearing
from the server, and close the connection when no ``PONG`` follows within ``keepalive``
seconds more. Anything from the server outside the grammar (including an event with an
unknown verb) closes the connection, as the spec requires of a client.
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
from msgbroker.clientkit.reconnect import Reconnect
from msgbroker.clientkit.reconnecting import ReconnectingClient, connect_reconnecting
from msgbroker.clientkit.session import SessionAttribute
from msgbroker.clientkit.tls import client_tls_options

from .blocking import BlockingSSMPClient
from .client_session import (
    DEFAULT_PORT,
    KEEPALIVE,
    SSMPClientSession,
    SSMPConnectionClosed,
    SSMPError,
    SSMPRequests,
)
from .codec import Delivery, Presence

__all__ = [
    "BlockingSSMPClient",
    "Delivery",
    "Presence",
    "Reconnect",
    "ReconnectingSSMPClient",
    "SSMPClientFactory",
    "SSMPClientProtocol",
    "SSMPClientSession",
    "SSMPConnectionClosed",
    "SSMPError",
    "client_tls_options",
    "connect",
]


class SSMPClientProtocol(SSMPRequests, StreamClientProtocol):
    """An SSMP client connection. Every request method returns a Deferred that fires with
    ``None`` on ``200`` and fails with :class:`SSMPError` otherwise (or
    :class:`SSMPConnectionClosed` if the connection ends first); invalid ids or payloads
    raise ``ValueError`` at once, before anything is sent.

    Events go to :meth:`on_message` and :meth:`on_presence`: override them, or pass
    callables to the constructor. ``clock`` drives the keepalive (default: the global
    reactor); ``keepalive=None`` turns it off.
    """

    log = Logger(namespace="msgbroker.ssmp.client")
    client_name = "SSMP client"
    session: SSMPClientSession

    def __init__(
        self,
        clock: Any = None,
        keepalive: float | None = KEEPALIVE,
        on_message: Callable[[Delivery], object] | None = None,
        on_presence: Callable[[Presence], object] | None = None,
    ) -> None:
        super().__init__(SSMPClientSession(keepalive), clock)
        self._use_handlers(on_message=on_message, on_presence=on_presence)

    identity = SessionAttribute("the identity logged in as")

    # -- events (override, or pass callables) -------------------------------------------------

    def on_message(self, delivery: Delivery) -> None:
        """A forwarded MCAST, UCAST or BCAST (``delivery.kind``)."""

    def on_presence(self, presence: Presence) -> None:
        """A SUBSCRIBE or UNSUBSCRIBE presence event."""

    # -- requests (subscribe, unsubscribe, mcast, ucast, bcast: SSMPRequests') -----------------

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | None = None
    ) -> defer.Deferred[None]:
        return self._request(lambda: self.session.login(identity, scheme, credential))

    def ping(self) -> defer.Deferred[None]:
        """Send ``PING``; fires when the matching ``PONG`` event arrives."""
        return self._request(self.session.ping)

    def close(self) -> defer.Deferred[None]:
        """Send ``CLOSE``; fires once the connection is gone."""
        if self.closed:
            return defer.succeed(None)
        closed = self.when_closed()
        if not self.session.closing:
            reply = self._request(self.session.request_close)
            reply.addBoth(lambda _: None if self.closed else self._drop(abort=False))
        return closed.addCallback(lambda _: None)

    def _perform(self, ask: Callable[[], int]) -> defer.Deferred[None]:
        return self._request(ask)

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, Delivery):
            self._deliver(self.on_message, event)
        else:
            self._deliver(self.on_presence, event)


class ReconnectingSSMPClient(SSMPRequests, ReconnectingClient):
    """The SSMP requests on the connection a
    :class:`~msgbroker.clientkit.reconnecting.ReconnectingClient` keeps up, logged in and
    subscribed again after each reconnection (what ``connect(..., reconnect=...)`` gives).
    Requests go to the live connection and fire as :class:`SSMPClientProtocol`'s do; while
    reconnecting they fail at once with :class:`SSMPConnectionClosed`, as do the ones in
    flight when the connection drops (never sent again). ``close()`` stops it."""

    identity = SessionAttribute("the identity logged in as")

    def ping(self) -> defer.Deferred[None]:
        return self._forward_deferred(lambda proto: proto.ping())

    def _perform(self, ask: Callable[[], int]) -> defer.Deferred[None]:
        return self._forward_deferred(lambda proto: proto._perform(ask))


class SSMPClientFactory(ClientFactory):
    """Builds :class:`SSMPClientProtocol` (or ``protocol_class``) with the given options."""

    protocol = SSMPClientProtocol


def connect(
    reactor: Any,
    endpoint_or_host: Any,
    port: int = DEFAULT_PORT,
    *,
    identity: str,
    scheme: str = "open",
    credential: bytes | None = None,
    tls: Any = None,
    protocol_class: type[SSMPClientProtocol] = SSMPClientProtocol,
    timeout: float = 30.0,
    reconnect: Reconnect | bool | None = None,
    **options: Any,
) -> defer.Deferred[Any]:
    """Connect and log in; a Deferred of the logged-in protocol — or, with ``reconnect``
    (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`), of a
    :class:`ReconnectingSSMPClient` that connects, logs in and subscribes again after each
    loss, with backoff.

    ``endpoint_or_host`` is a host name or address (with ``port``), or any
    ``IStreamClientEndpoint``. ``tls`` is ``None`` for plain TCP, ``True`` to verify the
    server against the system's CAs, or a client connection creator such as
    :func:`client_tls_options`. ``options`` go to the protocol (``keepalive``,
    ``on_message``, ``on_presence``); its clock is ``reactor``. A refused login fails with
    :class:`SSMPError` (``401``) and the connection is closed.
    """
    endpoint = client_endpoint(reactor, endpoint_or_host, port, tls=tls, timeout=timeout)
    options.setdefault("clock", reactor)
    factory = SSMPClientFactory(protocol_class, **options)

    def login(proto: SSMPClientProtocol) -> defer.Deferred[None]:
        return proto.login(identity, scheme, credential)

    if reconnect:
        return connect_reconnecting(
            reactor, endpoint, factory, login, reconnect, ReconnectingSSMPClient, timeout
        )
    return connect_client(endpoint, factory, login)
