"""Micromessage2 clients: a Twisted protocol and a blocking client (:mod:`.blocking`), both
driving the sans-IO :class:`~.client_session.ClientSession` (the handshake, windows, acks,
``json`` and ``dotnet``), itself on the codec (:mod:`msgbroker.plugins.mm2.codec`).

Twisted::

    proto = yield connect(reactor, "127.0.0.1", identity="alice",
                          optional=("batch-ack", "json"),
                          on_message=lambda m: print(m.destination, m.payload, m.properties))
    proto.subscribe("news", filters=["price>=N10"])     # written at once; no reply comes
    seq = yield proto.publish("news", b"hello", {"price": 12})   # fires once written
    yield proto.when_acked()                              # the server acknowledged it all
    yield proto.close()

Blocking::

    with BlockingMM2Client("127.0.0.1", identity="alice") as client:
        client.subscribe("news")
        message = client.next_message(timeout=5)          # a Message, or None

Publishing and the ack window: with ``ack`` (window 1) or ``batch-ack`` (window max-count)
active, at most that many published messages are unacknowledged. The Twisted client queues
the publishes that do not fit, in order, and fires each one's Deferred with its seq when it
is written (or fails it with :class:`MM2Timeout` when ``timeout`` seconds pass in the
queue: it is then never sent). Commands (subscribe, unsubscribe) are not MESSAGE frames and
are written at once, ahead of queued publishes.

Receiving: each message goes to :meth:`MM2ClientProtocol.on_message` (override it or pass
``on_message``). With an ack extension active the client acknowledges it when that callback
returns — or, when it returns a Deferred, when that fires (a failure is logged and the
message acknowledged all the same: Micromessage2 has no negative ack). Acks are cumulative:
one per batch of input, covering the messages handled in order. With ``auto_ack=False`` the
application calls :meth:`~MM2ClientProtocol.ack` instead.

Micromessage2 has no heartbeat and COMMAND frames no reply, so neither client invents one.
An ERROR frame from the server fails whatever is pending with :class:`MM2ServerError`;
anything the server gets wrong makes the client send an ERROR frame and close.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory

from msgbroker.clientkit.tls import TLSClientEndpoint, client_tls_options

from .blocking import BlockingMM2Client
from .client_common import (
    DEFAULT_PORT,
    TIMEOUT,
    Message,
    MM2ConnectionClosed,
    MM2Error,
    MM2HandshakeRefused,
    MM2ProtocolError,
    MM2ServerError,
    MM2Timeout,
)
from .client_protocol import MM2ClientProtocol
from .client_session import ExtensionReceived

__all__ = [
    "DEFAULT_PORT",
    "TIMEOUT",
    "BlockingMM2Client",
    "ExtensionReceived",
    "MM2ClientFactory",
    "MM2ClientProtocol",
    "MM2ConnectionClosed",
    "MM2Error",
    "MM2HandshakeRefused",
    "MM2ProtocolError",
    "MM2ServerError",
    "MM2Timeout",
    "Message",
    "client_tls_options",
    "connect",
]


class MM2ClientFactory(Factory):
    """Builds :class:`MM2ClientProtocol` (or ``protocol_class``) with the given options."""

    def __init__(
        self, protocol_class: type[MM2ClientProtocol] = MM2ClientProtocol, **options: Any
    ) -> None:
        self.protocol_class = protocol_class
        self.options = options

    def buildProtocol(self, addr: Any) -> MM2ClientProtocol:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto


@defer.inlineCallbacks
def connect(
    reactor: Any,
    endpoint_or_host: Any,
    port: int | None = None,
    *,
    identity: str,
    tls: Any = None,
    protocol_class: Any = None,
    connect_timeout: float = 30.0,
    **options: Any,
) -> Any:
    """Connect and complete the handshake; a Deferred of the ready protocol.

    ``endpoint_or_host`` is a host name or address (with ``port``, default 4447) or any
    ``IStreamClientEndpoint``. ``tls`` is ``None`` for plain TCP, ``True`` to verify the
    server against the system's CAs, or a client connection creator such as
    :func:`client_tls_options`. ``options`` go to :class:`MM2ClientProtocol` (``required``,
    ``optional``, ``supported``, ``on_message``, ``timeout``, ...); its clock is
    ``reactor``. A refused handshake fails with :class:`MM2HandshakeRefused` or
    :class:`MM2ServerError`, and the connection is closed.
    """
    if IStreamClientEndpoint.providedBy(endpoint_or_host):
        endpoint = endpoint_or_host
    else:
        where = DEFAULT_PORT if port is None else port
        endpoint = HostnameEndpoint(reactor, endpoint_or_host, where, timeout=connect_timeout)
        if tls is True:
            tls = client_tls_options(endpoint_or_host)
    if tls is not None and tls is not False:
        endpoint = TLSClientEndpoint(tls, endpoint, reactor)
    options.setdefault("clock", reactor)
    factory = MM2ClientFactory(protocol_class or MM2ClientProtocol, identity=identity, **options)
    proto = yield endpoint.connect(factory)
    try:
        yield proto.when_ready()
    except BaseException:
        if not proto._lost and proto.session.state != "closed":  # else it closes itself
            proto.transport.abortConnection()
        raise
    return proto
