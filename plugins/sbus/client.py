"""sbus clients: a Twisted protocol on :class:`~.seqpacket.SeqpacketConnection` and a
blocking client (:mod:`.blocking`), both on the sans-IO codec (:mod:`.codec`).

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
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from msgbroker.errors import RemoteProtocolError

from . import codec, seqpacket
from .blocking import (
    ADDRESS_ENV,
    TIMEOUT,
    BlockingClient,
    BlockingSbusClient,
    SbusConnectionClosed,
    SbusVerbs,
    as_address,
    default_address,
    inherited_socket,
    server_packet,
)
from .codec import ControlMessage, Publish
from .seqpacket import SeqpacketAddress, SeqpacketConnection

__all__ = [
    "ADDRESS_ENV",
    "BlockingClient",
    "BlockingSbusClient",
    "ControlMessage",
    "Publish",
    "SbusClient",
    "SbusConnectionClosed",
    "connect",
    "default_address",
]

log = Logger(namespace="msgbroker.sbus.client")

#: how often :func:`connect` tries again while the broker's accept queue is full
_RETRY = 0.01


class SbusClient(SbusVerbs, Protocol):
    """One sbus connection (see the module docstring). Sending methods write at once and
    return None; they raise :class:`SbusConnectionClosed` once the connection is closing
    or gone, and ValueError (before anything is sent) for a NUL in a key or pattern."""

    transport: Any  # a SeqpacketConnection

    def __init__(
        self,
        on_message: Callable[[Publish], object] | None = None,
        on_control: Callable[[ControlMessage], object] | None = None,
        max_packet: int = codec.DEFAULT_MAX_PACKET,
    ) -> None:
        self._message_callback = on_message
        self._control_callback = on_control
        #: the largest packet accepted from the broker
        self.max_packet = max_packet
        self._whoami: deque[defer.Deferred[bytes]] = deque()
        self._close_waiters: list[defer.Deferred[BaseException]] = []
        self._closing = False
        self._lost = False
        self._failure: BaseException | None = None

    # -- events (override) -------------------------------------------------------------------

    def on_message(self, message: Publish) -> None:
        """A ``MSG`` matching one of this client's subscriptions."""
        if self._message_callback is not None:
            self._message_callback(message)

    def on_control(self, message: ControlMessage) -> None:
        """A ``CMSG`` from the broker that answers no :meth:`whoami`."""
        if self._control_callback is not None:
            self._control_callback(message)

    # -- sending -----------------------------------------------------------------------------

    def whoami(self) -> defer.Deferred[bytes]:
        """Fires with this client's credentials as the broker sees them,
        ``b"!/cred/GID/UID/PID"`` (longer through a relay); fails with
        :class:`SbusConnectionClosed` if the connection ends first."""
        if self._lost or self._closing:
            return defer.fail(SbusConnectionClosed("the connection is closed"))
        d: defer.Deferred[bytes] = defer.Deferred()
        self._whoami.append(d)
        self.transport.write(codec.encode_packet(ControlMessage(codec.WHOAMI)))
        return d

    def sync(self) -> defer.Deferred[None]:
        """Fires once the broker handled everything written before, and every message it
        routed to this client meanwhile went to :meth:`on_message` (a :meth:`whoami`
        round trip: the broker handles one client's packets in order)."""
        return self.whoami().addCallback(lambda _: None)

    def close(self) -> defer.Deferred[None]:
        """Close once what waits to be written is sent (the broker still handles it);
        fires when the connection is gone."""
        closed = self.when_closed()
        if not self._lost and not self._closing:
            self._closing = True
            self.transport.loseConnection()
        return closed.addCallback(lambda _: None)

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires with the reason (an exception) when the connection is gone."""
        if self._lost:
            return defer.succeed(self._failure or SbusConnectionClosed("closed"))
        d: defer.Deferred[BaseException] = defer.Deferred()
        self._close_waiters.append(d)
        return d

    @property
    def closed(self) -> bool:
        return self._lost

    def _send(self, packet: codec.Packet) -> None:
        data = codec.encode_packet(packet)
        if self._lost or self._closing:
            raise SbusConnectionClosed("the connection is closed")
        self.transport.write(data)

    # -- Twisted -----------------------------------------------------------------------------

    def packetReceived(self, data: bytes) -> None:
        if self._lost:
            return
        try:
            packet = server_packet(data, self.max_packet)
        except RemoteProtocolError as e:
            self._abort(SbusConnectionClosed(f"protocol error from the broker: {e}"))
            return
        if isinstance(packet, Publish):
            self._deliver(self.on_message, packet)
        elif packet.key == codec.WHOAMI and self._whoami:
            self._whoami.popleft().callback(packet.payload)
        else:
            self._deliver(self.on_control, packet)

    def _deliver(self, handler: Callable[[Any], object], packet: Any) -> None:
        try:
            handler(packet)
        except Exception:
            log.failure("sbus message handler failed on {packet!r}", packet=packet)

    def _abort(self, reason: BaseException) -> None:
        if self._failure is None:
            self._failure = reason
        log.info("sbus client closing the connection: {reason}", reason=reason)
        self._fail_pending(reason)
        self.transport.abortConnection()

    def _fail_pending(self, reason: BaseException) -> None:
        pending, self._whoami = self._whoami, deque()
        for d in pending:
            d.errback(reason)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._failure is None:
            text = reason.getErrorMessage() if reason is not None else "connection lost"
            self._failure = SbusConnectionClosed(text)
        self._fail_pending(self._failure)
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self._failure)

    def flood_error(self, reason: str) -> None:
        """Never called: this side's outbox keeps whatever the socket cannot take yet."""
        self._abort(SbusConnectionClosed(reason))


def connect(
    reactor: Any,
    address: SeqpacketAddress | str | None = None,
    *,
    timeout: float = TIMEOUT,
    protocol_class: type[SbusClient] = SbusClient,
    **options: Any,
) -> defer.Deferred[SbusClient]:
    """Connect to the bus at ``address`` (a socket path, ``@name``,
    ``/dev/unix/abstract/HEX``, ``/dev/fd/N``; None: :func:`default_address`); a Deferred
    of the connected :class:`SbusClient` (or ``protocol_class``), built with ``options``
    (``on_message``, ``on_control``, ``max_packet``).

    Fails with the ``OSError`` of the connect (``FileNotFoundError``,
    ``ConnectionRefusedError``, ...), or ``TimeoutError`` when the broker's accept queue
    stays full for ``timeout`` seconds.
    """
    try:
        where = as_address(address)
    except ValueError as e:
        return defer.fail(e)
    done: defer.Deferred[SbusClient] = defer.Deferred()
    deadline = reactor.seconds() + timeout

    def attempt() -> None:
        try:
            sock = _connect_nonblocking(where)
        except BlockingIOError:
            # AF_UNIX connects at once, or says EAGAIN while the accept queue is full
            if reactor.seconds() >= deadline:
                done.errback(TimeoutError(f"{where}: the broker accepted nobody for {timeout:g} s"))
            else:
                reactor.callLater(_RETRY, attempt)
            return
        except OSError as e:
            done.errback(e)
            return
        proto = protocol_class(**options)
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


def _connect_nonblocking(address: SeqpacketAddress) -> socket.socket:
    if address.fd is not None:
        sock = inherited_socket(address.fd)
        sock.setblocking(False)
        return sock
    sock = seqpacket.new_socket()
    try:
        sock.connect(address.sockaddr())
    except BaseException:
        sock.close()
        raise
    return sock
