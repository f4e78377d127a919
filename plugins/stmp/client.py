"""STMP 0.1 clients: Twisted protocols for TCP (binary serialization) and WebSocket (text
serialization, on autobahn), and a blocking client, all on the sans-IO codec
(:mod:`msgbroker.plugins.stmp.codec`) and one sans-IO session
(:class:`~.client_session.STMPClientSession`), driven by :mod:`msgbroker.clientkit`.

Twisted::

    proto = yield connect(reactor, "127.0.0.1", identity="alice",
                          on_delivery=lambda d: print(d.sender, d.kind, d.topic, d.data))
    yield proto.subscribe("news")
    yield proto.publish("news", b"hello")        # fires once the broker answered Ok
    reply = yield proto.request("10.1.0.1", {"q": 1})   # any action: a Response
    yield proto.close()

    proto = yield connect(reactor, "127.0.0.1", ws=True, identity="bob")   # ws://...:4446/

Blocking::

    with BlockingSTMPClient("127.0.0.1", identity="alice") as client:
        client.subscribe("news")
        delivery = client.next_delivery(timeout=5)     # a Delivery, or None

Requests carry ids (1 to 65535, wrapping; 0 is the version check's; an id still pending is
never reused), so replies may come in any order. :meth:`STMPClientProtocol.request` fires
with the :class:`~msgbroker.plugins.stmp.codec.Response` whatever its status; when none came
within the timeout it fires with a local ``Response(id, 0x25)`` (RequestTimeout) and the late
reply, if it ever comes, is dropped. :meth:`~STMPClientProtocol.call` and the broker actions
(``login``, ``subscribe``, ``unsubscribe``, ``publish``, ``unicast``, ``broadcast``) fire with
the decoded reply payload on Ok and fail with :class:`STMPError` otherwise (0x25 included,
with ``local=True``). Connection loss fails whatever is pending with
:class:`STMPConnectionClosed`.

Both clients send the version check first (request, action 0, id 0, raw list of versions) and
give up with ``STMPError(0x35)`` when the server refuses; both ping every ``heartbeat``
seconds and close after two intervals without hearing from the server. A malformed message
from the server closes the connection.

The connection's logic is :mod:`.client_session`'s, the values and errors
:mod:`.client_common`'s, the blocking client :mod:`.blocking`'s; this module re-exports
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from msgbroker.clientkit.protocol import (
    ClientFactory,
    SessionDriver,
    StreamClientProtocol,
    client_endpoint,
    connect_client,
)
from msgbroker.clientkit.reconnect import Reconnect
from msgbroker.clientkit.reconnecting import ReconnectingClient, connect_reconnecting
from msgbroker.clientkit.session import SessionAttribute
from msgbroker.clientkit.tls import client_tls_options
from msgbroker.clientkit.twisted_ws import (
    WebSocketClientDriver,
    WebSocketClientFactory,
    websocket_url,
)

from . import codec
from .blocking import BlockingSTMPClient
from .client_common import (
    DEFAULT_PORT,
    DEFAULT_WS_PORT,
    HEARTBEAT,
    REQUEST_TIMEOUT,
    BinaryWire,
    Delivery,
    STMPConnectionClosed,
    STMPError,
    WebSocketWire,
    status_name,
)
from .client_session import DroppedDelivery, Ready, STMPClientSession, STMPRequests, Wire
from .codec import Encoding, Notify

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_WS_PORT",
    "HEARTBEAT",
    "REQUEST_TIMEOUT",
    "BlockingSTMPClient",
    "Delivery",
    "Reconnect",
    "ReconnectingSTMPClient",
    "STMPClientBase",
    "STMPClientFactory",
    "STMPClientProtocol",
    "STMPClientSession",
    "STMPConnectionClosed",
    "STMPError",
    "STMPWebSocketClientFactory",
    "STMPWebSocketClientProtocol",
    "client_tls_options",
    "connect",
    "status_name",
]


class STMPClientBase(STMPRequests, SessionDriver):
    """The STMP API on a :class:`~msgbroker.clientkit.protocol.SessionDriver`, whatever the
    transport: the TCP and WebSocket protocols below mix it in (and give it their ``wire``).

    Events go to :meth:`on_delivery` (deliveries, notify ``0.0.1.16``) and :meth:`on_notify`
    (any other notify): override them or pass callables. ``clock`` drives timers (default:
    the global reactor); ``heartbeat=None`` turns the heartbeat off; ``encoding`` (JSON or
    msgpack) is used by the broker actions and as the default of :meth:`request`;
    ``timeout`` is the default request timeout in seconds.
    """

    log = Logger(namespace="msgbroker.stmp.client")
    client_name = "STMP client"
    opening_exchange = True
    session: STMPClientSession

    def __init__(
        self,
        clock: Any = None,
        heartbeat: float | None = HEARTBEAT,
        encoding: int = Encoding.JSON,
        timeout: float = REQUEST_TIMEOUT,
        on_delivery: Callable[[Delivery], object] | None = None,
        on_notify: Callable[[Notify], object] | None = None,
        *,
        wire: Wire,
    ) -> None:
        session = STMPClientSession(wire, encoding=encoding, timeout=timeout, heartbeat=heartbeat)
        super().__init__(session, clock)
        self._use_handlers(on_delivery=on_delivery, on_notify=on_notify)

    timeout = SessionAttribute("the default request timeout (s)")

    # -- events (override, or pass callables) -------------------------------------------------

    def on_delivery(self, delivery: Delivery) -> None:
        """A message routed to this client (mcast, ucast, bcast) or a presence event."""

    def on_notify(self, notify: Notify) -> None:
        """A notify other than a delivery (from a plugin's action)."""

    # -- requests (STMPRequests': each returns a Deferred) -------------------------------------

    def _perform(self, ask: Callable[[float], int]) -> defer.Deferred[Any]:
        try:
            return self._request(lambda: ask(self._now()))
        except STMPError as e:  # all 65535 ids in use
            return defer.fail(e)

    def _perform_write(self, write: Callable[[float], None]) -> None:
        self._write_now(lambda: write(self._now()))

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, Delivery):
            self._deliver(self.on_delivery, event)
        elif isinstance(event, Ready):
            self._ready(event.version)
        elif isinstance(event, DroppedDelivery):
            self.log.warn("STMP malformed delivery dropped: {why}", why=event.reason)
        else:
            self._deliver(self.on_notify, event)


class STMPClientProtocol(STMPClientBase, StreamClientProtocol):
    """An STMP client over TCP: binary serialization with PS. See :class:`STMPClientBase`;
    :meth:`when_ready` fires with the version the server chose."""

    def __init__(self, *args: Any, max_payload: int = codec.DEFAULT_MAX_PAYLOAD, **kw: Any):
        super().__init__(*args, wire=BinaryWire(max_payload), **kw)


class STMPWebSocketClientProtocol(STMPClientBase, WebSocketClientDriver):  # type: ignore[misc]
    """An STMP client over WebSocket (autobahn): text frames — a binary payload (msgpack,
    raw) as the text header plus one binary frame — or, with ``binary_frames=True``, one
    binary-serialized message (without PS) per binary frame. See :class:`STMPClientBase`.
    The version check starts once the WebSocket handshake is done."""

    def __init__(
        self,
        *args: Any,
        binary_frames: bool = False,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        **kw: Any,
    ) -> None:
        super().__init__(*args, wire=WebSocketWire(max_payload, binary_frames), **kw)
        self.binary_frames = binary_frames


class ReconnectingSTMPClient(STMPRequests, ReconnectingClient):
    """The STMP requests on the connection a
    :class:`~msgbroker.clientkit.reconnecting.ReconnectingClient` keeps up (TCP or
    WebSocket), version-checked, logged in and subscribed again after each reconnection
    (what ``connect(..., reconnect=...)`` gives). Requests go to the live connection; while
    reconnecting they fail at once with :class:`STMPConnectionClosed`, as do the ones in
    flight when the connection drops (never sent again). ``close()`` stops it."""

    def _perform(self, ask: Callable[[float], int]) -> defer.Deferred[Any]:
        return self._forward_deferred(lambda proto: proto._perform(ask))

    def _perform_write(self, write: Callable[[float], None]) -> None:
        self._forward(lambda proto: proto._perform_write(write))


class STMPClientFactory(ClientFactory):
    """Builds :class:`STMPClientProtocol` (or ``protocol_class``) with the given options."""

    protocol = STMPClientProtocol


class STMPWebSocketClientFactory(WebSocketClientFactory):
    """Builds :class:`STMPWebSocketClientProtocol` (or ``protocol_class``) for ``url``
    with the given options, its timers on ``reactor``."""

    def __init__(
        self,
        url: str,
        protocol_class: type[STMPWebSocketClientProtocol] = STMPWebSocketClientProtocol,
        reactor: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(url, protocol_class, reactor, **options)


# -- connecting -----------------------------------------------------------------------------------


def connect(
    reactor: Any,
    endpoint_or_host: Any,
    port: int | None = None,
    *,
    ws: bool = False,
    path: str = "/",
    tls: Any = None,
    identity: str | None = None,
    scheme: str = "open",
    credential: bytes | str | None = None,
    protocol_class: Any = None,
    connect_timeout: float = 30.0,
    reconnect: Reconnect | bool | None = None,
    **options: Any,
) -> defer.Deferred[Any]:
    """Connect, pass the version check and (with ``identity``) log in; a Deferred of the
    ready protocol — or, with ``reconnect`` (True, or a
    :class:`~msgbroker.clientkit.reconnect.Reconnect`), of a :class:`ReconnectingSTMPClient`
    that connects, logs in and subscribes again after each loss, with backoff.

    ``endpoint_or_host`` is a host name or address (with ``port``, default 4445, or 4446
    with ``ws``), or any ``IStreamClientEndpoint``. ``ws=True`` speaks WebSocket (``path``
    is the resource; ``binary_frames=True`` for binary frames instead of text). ``tls`` is
    ``None`` for plain TCP, ``True`` to verify the server against the system's CAs, or a
    client connection creator such as :func:`client_tls_options` (so ``wss`` is
    ``ws=True, tls=...``). ``options`` go to the protocol (``heartbeat``, ``encoding``,
    ``timeout``, ``on_delivery``, ``on_notify``, ...); its clock is ``reactor``. A refused
    version check or login fails with :class:`STMPError` and the connection is closed.
    """
    port = port if port is not None else (DEFAULT_WS_PORT if ws else DEFAULT_PORT)
    endpoint = client_endpoint(reactor, endpoint_or_host, port, tls=tls, timeout=connect_timeout)
    options.setdefault("clock", reactor)
    factory: Any
    if ws:
        host = endpoint_or_host if isinstance(endpoint_or_host, str) else "localhost"
        url = websocket_url(host, port, path, secure=tls is not None and tls is not False)
        factory = STMPWebSocketClientFactory(
            url, protocol_class or STMPWebSocketClientProtocol, reactor=reactor, **options
        )
    else:
        factory = STMPClientFactory(protocol_class or STMPClientProtocol, **options)

    def prepare(proto: Any) -> defer.Deferred[Any]:
        ready: defer.Deferred[Any] = proto.when_ready()
        if identity is not None:
            ready.addCallback(lambda _: proto.login(identity, scheme, credential))
        return ready

    if reconnect:
        return connect_reconnecting(
            reactor, endpoint, factory, prepare, reconnect, ReconnectingSTMPClient,
            connect_timeout,
        )  # fmt: skip
    return connect_client(endpoint, factory, prepare)
