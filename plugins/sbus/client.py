"""sbus clients: a Twisted protocol on :class:`~.seqpacket.SeqpacketConnection` and a
blocking client (:mod:`.blocking`), both driving the sans-IO
:class:`~.client_session.SbusClientSession` (on the codec, :mod:`.codec`) through
:mod:`msgbroker.clientkit`.

Twisted::

    client = yield connect(reactor, "/run/user/1000/msgbroker/sbus.socket",
                           on_message=lambda m: print(m.key, m.payload))
    client.subscribe(b"news/*")                  # written at once; sbus answers nothing
    yield client.sync()                          # the broker has the subscription now
    client.publish(b"news/today", b"hello")
    credentials = yield client.whoami()          # b"!/cred/1000/1000/4242"
    yield client.close()

Blocking: see :class:`BlockingSbusClient`.

Messages (``MSG``) go to :meth:`SbusClient.on_message` as :class:`~.codec.Publish` values,
control messages from the broker (``CMSG``) other than the answers to :meth:`whoami` to
:meth:`SbusClient.on_control`: override them, or pass callables to the constructor, as
with the SSMP and Micromessage2 clients. Anything from the broker outside the protocol (a
malformed packet, a ``SUB`` or ``UNSUB``) closes the connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from msgbroker.clientkit.blocking import adopt_socket
from msgbroker.clientkit.protocol import ClientFactory, StreamClientProtocol
from msgbroker.clientkit.reconnect import Reconnect
from msgbroker.clientkit.reconnecting import ReconnectingClient, connect_reconnecting

from . import codec, seqpacket
from .blocking import (
    ADDRESS_ENV,
    TIMEOUT,
    BlockingClient,
    BlockingSbusClient,
    SbusConnectionClosed,
    as_address,
    default_address,
)
from .client_session import SbusClientSession, SbusLoginRefused, SbusVerbs
from .codec import ControlMessage, Publish
from .seqpacket import SeqpacketAddress, SeqpacketConnection

__all__ = [
    "ADDRESS_ENV",
    "BlockingClient",
    "BlockingSbusClient",
    "ControlMessage",
    "Publish",
    "Reconnect",
    "ReconnectingSbusClient",
    "SbusClient",
    "SbusClientSession",
    "SbusConnectionClosed",
    "SbusEndpoint",
    "SbusLoginRefused",
    "connect",
    "default_address",
]

#: how often :func:`connect` tries again while the broker's accept queue is full
_RETRY = 0.01


class SbusClient(SbusVerbs, StreamClientProtocol):
    """One sbus connection (see the module docstring). Sending methods write at once and
    return None; they raise :class:`SbusConnectionClosed` once the connection is closing
    or gone, and ValueError (before anything is sent) for a NUL in a key or pattern. A
    :class:`~msgbroker.clientkit.protocol.SessionDriver` on a packet transport (its
    ``packetReceived``: a packet a unit)."""

    log = Logger(namespace="msgbroker.sbus.client")
    client_name = "sbus client"
    transport: Any  # a SeqpacketConnection
    session: SbusClientSession

    def __init__(
        self,
        on_message: Callable[[Publish], object] | None = None,
        on_control: Callable[[ControlMessage], object] | None = None,
        max_packet: int = codec.DEFAULT_MAX_PACKET,
        clock: Any = None,
    ) -> None:
        super().__init__(SbusClientSession(max_packet), clock)
        self._use_handlers(on_message=on_message, on_control=on_control)

    # -- events (override, or pass callables) -------------------------------------------------

    def on_message(self, message: Publish) -> None:
        """A ``MSG`` matching one of this client's subscriptions."""

    def on_control(self, message: ControlMessage) -> None:
        """A ``CMSG`` from the broker that answers no :meth:`whoami`."""

    # -- sending -----------------------------------------------------------------------------

    def sync(self) -> defer.Deferred[None]:
        """Fires once the broker handled everything written before, and every message it
        routed to this client meanwhile went to :meth:`on_message` (a :meth:`whoami`
        round trip: the broker handles one client's packets in order)."""
        return self.whoami().addCallback(lambda _: None)

    def close(self) -> defer.Deferred[None]:
        """Close once what waits to be written is sent (the broker still handles it);
        fires when the connection is gone."""
        return super().close()

    def _send(self, packet: codec.Packet) -> None:
        self._write_now(lambda: self.session.send(packet))

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, Publish):
            self._deliver(self.on_message, event)
        else:
            self._deliver(self.on_control, event)

    def _perform(self, ask: Callable[[], int]) -> defer.Deferred[bytes]:
        return self._request(ask)

    def packetReceived(self, data: bytes) -> None:
        self._transport_data(data)

    def flood_error(self, reason: str) -> None:
        """Never called: this side's outbox keeps whatever the socket cannot take yet."""
        self._abort(SbusConnectionClosed(reason))


class ReconnectingSbusClient(SbusVerbs, ReconnectingClient):
    """The sbus verbs on the connection a
    :class:`~msgbroker.clientkit.reconnecting.ReconnectingClient` keeps up: the patterns
    and the echo and flood choices are sent again after each reconnection (what
    ``connect(..., reconnect=...)`` gives). While reconnecting, sending raises
    :class:`SbusConnectionClosed` and :meth:`whoami` fails with it (nothing is queued,
    nothing sent again); ``close()`` stops it."""

    def sync(self) -> defer.Deferred[None]:
        """:meth:`SbusClient.sync` on the live connection."""
        return self.whoami().addCallback(lambda _: None)

    def _send(self, packet: codec.Packet) -> None:
        self._forward(lambda proto: proto._send(packet))

    def _perform(self, ask: Callable[[], int]) -> defer.Deferred[bytes]:
        return self._forward_deferred(lambda proto: proto._perform(ask))


class SbusEndpoint:
    """Where to connect to the bus at ``address``, as a Twisted client endpoint:
    :meth:`connect` builds the factory's protocol on a seqpacket connection. It fails with
    the ``OSError`` of the connect (``FileNotFoundError``, ``ConnectionRefusedError``, ...),
    or ``TimeoutError`` when the broker's accept queue stays full for ``timeout`` seconds."""

    def __init__(self, reactor: Any, address: SeqpacketAddress, timeout: float = TIMEOUT):
        self.reactor = reactor
        self.address = address
        self.timeout = timeout

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        reactor, where, timeout = self.reactor, self.address, self.timeout
        done: defer.Deferred[Any] = defer.Deferred()
        deadline = reactor.seconds() + timeout

        def attempt() -> None:
            try:
                sock = _connect_nonblocking(where)
            except BlockingIOError:
                # AF_UNIX connects at once, or says EAGAIN while the accept queue is full
                if reactor.seconds() >= deadline:
                    text = f"{where}: the broker accepted nobody for {timeout:g} s"
                    done.errback(TimeoutError(text))
                else:
                    reactor.callLater(_RETRY, attempt)
                return
            except OSError as e:
                done.errback(e)
                return
            proto = factory.buildProtocol(None)
            transport = SeqpacketConnection(
                sock, proto, reactor, max_packet=proto.max_packet, address=str(where)
            )
            # like a Twisted TCP transport, keep what the socket cannot take yet, unbounded:
            # this side has no publisher to pause and nobody to disconnect
            transport.outbox.policy.hard = "block"
            proto.makeConnection(transport)
            transport.startReading()
            done.callback(proto)

        attempt()
        return done


def connect(
    reactor: Any,
    address: SeqpacketAddress | str | None = None,
    *,
    timeout: float = TIMEOUT,
    protocol_class: type[SbusClient] = SbusClient,
    reconnect: Reconnect | bool | None = None,
    **options: Any,
) -> defer.Deferred[Any]:
    """Connect to the bus at ``address`` (a socket path, ``@name``,
    ``/dev/unix/abstract/HEX``, ``/dev/fd/N``; None: :func:`default_address`); a Deferred
    of the connected :class:`SbusClient` (or ``protocol_class``), built with ``options``
    (``on_message``, ``on_control``, ``max_packet``) — or, with ``reconnect`` (True, or a
    :class:`~msgbroker.clientkit.reconnect.Reconnect`), of a
    :class:`ReconnectingSbusClient` that connects and subscribes again after each loss,
    with backoff (not for ``/dev/fd/N``, a socket that cannot be opened again).

    Fails with the ``OSError`` of the connect (``FileNotFoundError``,
    ``ConnectionRefusedError``, ...), or ``TimeoutError`` when the broker's accept queue
    stays full for ``timeout`` seconds.
    """
    try:
        where = as_address(address)
    except ValueError as e:
        return defer.fail(e)
    options.setdefault("clock", reactor)
    endpoint = SbusEndpoint(reactor, where, timeout)
    factory = ClientFactory(protocol_class, **options)
    if not reconnect:
        return endpoint.connect(factory)
    if where.fd is not None:
        return defer.fail(ValueError(f"{where}: an inherited socket cannot be reconnected"))
    return connect_reconnecting(
        reactor, endpoint, factory, None, reconnect, ReconnectingSbusClient, timeout
    )


def _connect_nonblocking(address: SeqpacketAddress) -> socket.socket:
    if address.fd is not None:
        sock = adopt_socket(address.fd, kind=socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        return sock
    sock = seqpacket.new_socket()
    try:
        sock.connect(address.sockaddr())
    except BaseException:
        sock.close()
        raise
    return sock
