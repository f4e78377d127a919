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

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from msgbroker.errors import RemoteProtocolError

from . import codec
from .blocking import (
    DEFAULT_PORT,
    KEEPALIVE,
    BlockingSSMPClient,
    SSMPConnectionClosed,
    SSMPError,
)
from .codec import Delivery, Presence

__all__ = [
    "BlockingSSMPClient",
    "Delivery",
    "Presence",
    "SSMPClientFactory",
    "SSMPClientProtocol",
    "SSMPConnectionClosed",
    "SSMPError",
    "client_tls_options",
    "connect",
]

log = Logger(namespace="msgbroker.ssmp.client")


class SSMPClientProtocol(Protocol):
    """An SSMP client connection. Every request method returns a Deferred that fires with
    ``None`` on ``200`` and fails with :class:`SSMPError` otherwise (or
    :class:`SSMPConnectionClosed` if the connection ends first); invalid ids or payloads
    raise ``ValueError`` at once, before anything is sent.

    Events go to :meth:`on_message` and :meth:`on_presence`: override them, or pass
    callables to the constructor. ``clock`` drives the keepalive (default: the global
    reactor); ``keepalive=None`` turns it off.
    """

    transport: Any  # an ITransport; typed loosely as Twisted's interfaces confuse mypy

    def __init__(
        self,
        clock: Any = None,
        keepalive: float | None = KEEPALIVE,
        on_message: Callable[[Delivery], object] | None = None,
        on_presence: Callable[[Presence], object] | None = None,
    ) -> None:
        self.clock = clock
        self.keepalive = keepalive
        self._message_callback = on_message
        self._presence_callback = on_presence
        self.identity: str | None = None
        #: how many server PINGs this client answered with PONG
        self.pings_answered = 0
        self._decoder = codec.ReplyDecoder()
        self._replies: deque[defer.Deferred[None]] = deque()
        self._pongs: deque[defer.Deferred[None] | None] = deque()
        self._close_waiters: list[defer.Deferred[BaseException]] = []
        self._closing = False
        self._lost = False
        self._failure: BaseException | None = None
        self._timer: Any = None
        self._last_heard = 0.0
        self._pinged_at: float | None = None

    # -- events (override) -------------------------------------------------------------------

    def on_message(self, delivery: Delivery) -> None:
        """A forwarded MCAST, UCAST or BCAST (``delivery.kind``)."""
        if self._message_callback is not None:
            self._message_callback(delivery)

    def on_presence(self, presence: Presence) -> None:
        """A SUBSCRIBE or UNSUBSCRIBE presence event."""
        if self._presence_callback is not None:
            self._presence_callback(presence)

    # -- requests ----------------------------------------------------------------------------

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | None = None
    ) -> defer.Deferred[None]:
        d = self._request(codec.login(identity, scheme, credential))

        def logged_in(result: None) -> None:
            self.identity = identity

        return d.addCallback(logged_in)

    def subscribe(self, topic: str, presence: bool = False) -> defer.Deferred[None]:
        return self._request(codec.subscribe(topic, presence))

    def unsubscribe(self, topic: str) -> defer.Deferred[None]:
        return self._request(codec.unsubscribe(topic))

    def mcast(self, topic: str, payload: bytes) -> defer.Deferred[None]:
        return self._request(codec.mcast(topic, payload))

    def ucast(self, target: str, payload: bytes) -> defer.Deferred[None]:
        return self._request(codec.ucast(target, payload))

    def bcast(self, payload: bytes) -> defer.Deferred[None]:
        return self._request(codec.bcast(payload))

    def ping(self) -> defer.Deferred[None]:
        """Send ``PING``; fires when the matching ``PONG`` event arrives."""
        if self._lost or self._closing:
            return defer.fail(SSMPConnectionClosed("the connection is closed"))
        d: defer.Deferred[None] = defer.Deferred()
        self._pongs.append(d)
        self.transport.write(codec.ping())
        return d

    def close(self) -> defer.Deferred[None]:
        """Send ``CLOSE``; fires once the connection is gone."""
        if self._lost:
            return defer.succeed(None)
        closed = self.when_closed()
        if not self._closing:
            reply = self._request(codec.close())
            self._closing = True
            reply.addErrback(lambda failure: None)
            reply.addCallback(lambda _: self.transport.loseConnection())
        return closed.addCallback(lambda _: None)

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires with the reason (an exception) when the connection is lost."""
        if self._lost:
            return defer.succeed(self._failure or SSMPConnectionClosed("closed"))
        d: defer.Deferred[BaseException] = defer.Deferred()
        self._close_waiters.append(d)
        return d

    def _request(self, frame: bytes) -> defer.Deferred[None]:
        if self._lost or self._closing:
            return defer.fail(SSMPConnectionClosed("the connection is closed"))
        d: defer.Deferred[None] = defer.Deferred()
        self._replies.append(d)
        self.transport.write(frame)
        return d

    # -- Twisted -----------------------------------------------------------------------------

    def connectionMade(self) -> None:
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        self._last_heard = self.clock.seconds()
        if self.keepalive:
            self._timer = self.clock.callLater(self.keepalive, self._check_keepalive)

    def dataReceived(self, data: bytes) -> None:
        if self._lost:
            return
        self._last_heard = self.clock.seconds()
        try:
            for message in self._decoder.feed(data):
                self._dispatch(message)
                if self._lost:
                    return
        except RemoteProtocolError as e:
            self._abort(e)

    def _dispatch(self, message: codec.ServerMessage) -> None:
        if isinstance(message, Delivery):
            self._deliver(self.on_message, message)
        elif isinstance(message, codec.Reply):
            if not self._replies:
                raise RemoteProtocolError(f"reply {message.code} to no request")
            d = self._replies.popleft()
            if message.code == 200:
                d.callback(None)
            else:
                d.errback(SSMPError(message.code, message.payload))
        elif isinstance(message, Presence):
            self._deliver(self.on_presence, message)
        elif isinstance(message, codec.ServerPing):
            self.pings_answered += 1
            self.transport.write(codec.pong())
        else:  # ServerPong
            self._pinged_at = None
            if self._pongs:
                waiter = self._pongs.popleft()
                if waiter is not None:
                    waiter.callback(None)

    def _deliver(self, handler: Callable[[Any], object], event: Any) -> None:
        try:
            handler(event)
        except Exception:
            log.failure("SSMP event handler failed on {event!r}", event=event)

    def _check_keepalive(self) -> None:
        """Ping after ``keepalive`` s without hearing from the server; give up when the
        ``PONG`` has not come ``keepalive`` s later."""
        self._timer = None
        interval = self.keepalive
        assert interval
        now = self.clock.seconds()
        if self._pinged_at is not None:
            if now - self._pinged_at >= interval:
                self._abort(SSMPConnectionClosed(f"no PONG within {interval:g} s"))
                return
            due = self._pinged_at + interval
        elif now - self._last_heard >= interval:
            self._pinged_at = now
            self._pongs.append(None)
            self.transport.write(codec.ping())
            due = now + interval
        else:
            due = self._last_heard + interval
        self._timer = self.clock.callLater(due - now, self._check_keepalive)

    def _abort(self, reason: BaseException) -> None:
        """Close at once (a grammar error or a dead peer), failing what is pending with
        ``reason``."""
        if self._failure is None:
            self._failure = reason
        log.info("SSMP client closing the connection: {reason}", reason=reason)
        self._fail_pending(reason)
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        else:
            self.transport.loseConnection()

    def _fail_pending(self, reason: BaseException) -> None:
        replies, self._replies = self._replies, deque()
        pongs, self._pongs = self._pongs, deque()
        for d in replies:
            d.errback(reason)
        for waiter in pongs:
            if waiter is not None:
                waiter.errback(reason)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._lost = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._failure is None:
            text = reason.getErrorMessage() if reason is not None else "connection lost"
            self._failure = SSMPConnectionClosed(text)
        self._fail_pending(self._failure)
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self._failure)


class SSMPClientFactory(Factory):
    """Builds :class:`SSMPClientProtocol` (or ``protocol_class``) with the given options."""

    def __init__(
        self, protocol_class: type[SSMPClientProtocol] = SSMPClientProtocol, **options: Any
    ) -> None:
        self.protocol_class = protocol_class
        self.options = options

    def buildProtocol(self, addr: Any) -> SSMPClientProtocol:
        proto = self.protocol_class(**self.options)
        proto.factory = self
        return proto


def client_tls_options(
    hostname: str, ca: str | None = None, cert: str | None = None, key: str | None = None
) -> Any:
    """TLS options for :func:`connect`: verify the server as ``hostname`` (a name or an IP
    address) against ``ca`` (PEM file; default: the system's trust store), presenting the
    client certificate ``cert`` with ``key`` (PEM files; ``key`` may be inside ``cert``)."""
    from pathlib import Path

    from twisted.internet import ssl as tssl

    trust = tssl.Certificate.loadPEM(Path(ca).read_bytes()) if ca else None
    client = None
    if cert:
        pem = Path(cert).read_bytes() + (b"\n" + Path(key).read_bytes() if key else b"")
        client = tssl.PrivateCertificate.loadPEM(pem)
    return tssl.optionsForClientTLS(hostname, trustRoot=trust, clientCertificate=client)


@implementer(IStreamClientEndpoint)
class _TLSEndpoint:
    """Like ``wrapClientTLS``, but TLS's small-write aggregation runs on ``clock`` (the
    reactor given to :func:`connect`), not on the global reactor."""

    def __init__(self, creator: Any, endpoint: Any, clock: Any) -> None:
        self._creator = creator
        self._endpoint = endpoint
        self._clock = clock

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        wrapper = TLSMemoryBIOFactory(self._creator, True, factory, clock=self._clock)
        d = self._endpoint.connect(wrapper)
        return d.addCallback(lambda proto: proto.wrappedProtocol)


@defer.inlineCallbacks
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
    **options: Any,
) -> Any:
    """Connect and log in; a Deferred of the logged-in protocol.

    ``endpoint_or_host`` is a host name or address (with ``port``), or any
    ``IStreamClientEndpoint``. ``tls`` is ``None`` for plain TCP, ``True`` to verify the
    server against the system's CAs, or a client connection creator such as
    :func:`client_tls_options`. ``options`` go to the protocol (``keepalive``,
    ``on_message``, ``on_presence``); its clock is ``reactor``. A refused login fails with
    :class:`SSMPError` (``401``) and the connection is closed.
    """
    if IStreamClientEndpoint.providedBy(endpoint_or_host):
        endpoint = endpoint_or_host
    else:
        endpoint = HostnameEndpoint(reactor, endpoint_or_host, port, timeout=timeout)
        if tls is True:
            tls = client_tls_options(endpoint_or_host)
    if tls is not None and tls is not False:
        endpoint = _TLSEndpoint(tls, endpoint, reactor)
    options.setdefault("clock", reactor)
    proto = yield endpoint.connect(SSMPClientFactory(protocol_class, **options))
    try:
        yield proto.login(identity, scheme, credential)
    except BaseException:
        if not proto._lost:
            proto.transport.loseConnection()
        raise
    return proto
