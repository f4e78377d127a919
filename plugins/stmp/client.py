"""STMP 0.1 clients: Twisted protocols for TCP (binary serialization) and WebSocket (text
serialization, on autobahn), and a blocking client, all on the sans-IO codec
(:mod:`msgbroker.plugins.stmp.codec`).

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

The transport-independent logic is :mod:`.client_base`'s, the WebSocket protocol
:mod:`.client_ws`'s, the blocking client :mod:`.blocking`'s and what both clients share
:mod:`.common`'s; this module re-exports them.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from msgbroker.clientkit.tls import TLSClientEndpoint, client_tls_options
from msgbroker.errors import RemoteProtocolError

from . import codec
from .blocking import BlockingSTMPClient
from .client_base import STMPClientBase
from .client_ws import STMPWebSocketClientFactory, STMPWebSocketClientProtocol
from .codec import Message
from .common import (
    DEFAULT_PORT,
    DEFAULT_WS_PORT,
    HEARTBEAT,
    REQUEST_TIMEOUT,
    Delivery,
    STMPConnectionClosed,
    STMPError,
    status_name,
)

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_WS_PORT",
    "HEARTBEAT",
    "REQUEST_TIMEOUT",
    "BlockingSTMPClient",
    "Delivery",
    "STMPClientBase",
    "STMPClientFactory",
    "STMPClientProtocol",
    "STMPConnectionClosed",
    "STMPError",
    "STMPWebSocketClientFactory",
    "STMPWebSocketClientProtocol",
    "client_tls_options",
    "connect",
    "status_name",
]


# -- TCP ----------------------------------------------------------------------------------------


class STMPClientProtocol(STMPClientBase, Protocol):
    """An STMP client over TCP: binary serialization with PS. See :class:`STMPClientBase`."""

    transport: Any  # an ITransport; typed loosely as Twisted's interfaces confuse mypy

    def __init__(self, *args: Any, max_payload: int = codec.DEFAULT_MAX_PAYLOAD, **kw: Any):
        super().__init__(*args, **kw)
        self._decoder = codec.BinaryDecoder(max_payload)

    def connectionMade(self) -> None:
        self._stmp_open()

    def dataReceived(self, data: bytes) -> None:
        if self._lost:
            return
        try:
            for message in self._decoder.feed(data):
                self._stmp_received(message)
                if self._lost:
                    return
        except RemoteProtocolError as e:
            self._protocol_error(e)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._stmp_lost(reason)

    def _write(self, message: Message, inline: bool | None) -> None:
        self.transport.write(codec.encode_binary(message))

    def _drop(self, abort: bool) -> None:
        if abort and hasattr(self.transport, "abortConnection"):
            self.transport.abortConnection()
        else:
            self.transport.loseConnection()


class STMPClientFactory(Factory):
    """Builds :class:`STMPClientProtocol` (or ``protocol_class``) with the given options."""

    def __init__(
        self, protocol_class: type[STMPClientProtocol] = STMPClientProtocol, **options: Any
    ) -> None:
        self.protocol_class = protocol_class
        self.options = options

    def buildProtocol(self, addr: Any) -> STMPClientProtocol:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto


# -- connecting -----------------------------------------------------------------------------------


@defer.inlineCallbacks
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
    **options: Any,
) -> Any:
    """Connect, pass the version check and (with ``identity``) log in; a Deferred of the
    ready protocol.

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
    host = endpoint_or_host if isinstance(endpoint_or_host, str) else "localhost"
    if IStreamClientEndpoint.providedBy(endpoint_or_host):
        endpoint = endpoint_or_host
    else:
        endpoint = HostnameEndpoint(reactor, endpoint_or_host, port, timeout=connect_timeout)
        if tls is True:
            tls = client_tls_options(endpoint_or_host)
    secure = tls is not None and tls is not False
    if secure:
        endpoint = TLSClientEndpoint(tls, endpoint, reactor)
    options.setdefault("clock", reactor)
    factory: Any
    if ws:
        where = host if ":" not in host else f"[{host}]"
        url = f"{'wss' if secure else 'ws'}://{where}:{port}{path}"
        factory = STMPWebSocketClientFactory(
            url, protocol_class or STMPWebSocketClientProtocol, reactor=reactor, **options
        )
    else:
        factory = STMPClientFactory(protocol_class or STMPClientProtocol, **options)
    proto = yield endpoint.connect(factory)
    try:
        yield proto.when_ready()
        if identity is not None:
            yield proto.login(identity, scheme, credential)
    except BaseException:
        if not proto._lost:
            proto._drop(abort=True)
        raise
    return proto
