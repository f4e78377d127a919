"""Micromessage2 clients: a Twisted protocol and a blocking client (:mod:`.blocking`), both
driving the sans-IO :class:`~.client_session.ClientSession` (the handshake, windows, acks,
``json`` and ``dotnet``), itself on the codec (:mod:`msgbroker.plugins.mm2.codec`), through
:mod:`msgbroker.clientkit`.

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

from collections import deque
from collections.abc import Callable, Iterable
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
from msgbroker.clientkit.tls import client_tls_options

from .blocking import BlockingMM2Client
from .client_common import (
    DEFAULT_OPTIONAL,
    DEFAULT_PORT,
    DEFAULT_REQUIRED,
    TIMEOUT,
    Acked,
    ExtensionReceived,
    ExtensionSpec,
    Message,
    MM2Commands,
    MM2ConnectionClosed,
    MM2Error,
    MM2HandshakeRefused,
    MM2ProtocolError,
    MM2ServerError,
    MM2Timeout,
    Outgoing,
    Ready,
)
from .client_session import ClientSession
from .codec import (
    ActiveExtensions,
)

__all__ = [
    "DEFAULT_PORT",
    "TIMEOUT",
    "BlockingMM2Client",
    "ClientSession",
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
    "Reconnect",
    "ReconnectingMM2Client",
    "client_tls_options",
    "connect",
]


class _Publish:
    """A publish waiting for the handshake or for room in the window."""

    def __init__(self, message: Outgoing | tuple[Any, ...], d: defer.Deferred[int]) -> None:
        # a tuple: the arguments, checked once the handshake is done (then an Outgoing, or
        # the exception that refused it)
        self.message: Outgoing | tuple[Any, ...] | BaseException = message
        self.d = d
        self.timer: Any = None


class MM2ClientProtocol(MM2Commands, StreamClientProtocol):
    """A Micromessage2 client connection; see the module's description. The handshake
    starts on connecting; :meth:`when_ready` fires with the active extensions.

    ``identity``, ``required``, ``optional``, ``supported`` and ``accept_suggested`` are
    :class:`~.client_session.ClientSession`'s. ``clock`` drives the timeouts (default: the
    global reactor); ``timeout`` bounds the handshake and a publish's wait for room (None:
    no bound). Events: :meth:`on_message` and :meth:`on_extension` (EXTENSION frames of
    active extensions without a built-in meaning, such as vendor ``x-...`` ones).
    """

    log = Logger(namespace="msgbroker.mm2.client")
    client_name = "MM2 client"
    opening_exchange = True
    session: ClientSession

    def __init__(
        self,
        identity: str = "",
        required: Iterable[ExtensionSpec] = DEFAULT_REQUIRED,
        optional: Iterable[ExtensionSpec] = DEFAULT_OPTIONAL,
        *,
        clock: Any = None,
        timeout: float | None = TIMEOUT,
        auto_ack: bool = True,
        on_message: Callable[[Message], object] | None = None,
        on_extension: Callable[[ExtensionReceived], object] | None = None,
        **session_options: Any,
    ) -> None:
        session = ClientSession(identity, required, optional, timeout=timeout, **session_options)
        super().__init__(session, clock)
        self.timeout = timeout
        self.auto_ack = auto_ack
        self._use_handlers(on_message=on_message, on_extension=on_extension)
        self._queue: deque[_Publish] = deque()
        self._early: list[Callable[[], object]] = []  # commands asked for before ready
        self._acked_waiters: list[defer.Deferred[None]] = []
        self._receiving = False
        self._draining = False

    # -- events (override, or pass callables) -------------------------------------------------

    def on_message(self, message: Message) -> object:
        """A message the server delivered. A Deferred returned delays its ack."""
        return None

    def on_extension(self, event: ExtensionReceived) -> None:
        """An EXTENSION frame of an active extension with no built-in meaning."""

    # -- state -------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Publishes waiting for room in the window (or for the handshake)."""
        return len(self._queue)

    def when_ready(self) -> defer.Deferred[ActiveExtensions]:
        """Fires with the active extensions once step 3 is written; fails with
        :class:`MM2HandshakeRefused`, :class:`MM2ServerError`, :class:`MM2Timeout` or
        :class:`MM2ConnectionClosed`."""
        return super().when_ready()

    def when_acked(self) -> defer.Deferred[None]:
        """Fires when no publish is queued and the server acknowledged every message."""
        if not self._queue and not self.session.unacked and self.session.ready:
            return defer.succeed(None)
        if self.closed or self.session.ended:
            return defer.fail(self.session.pending_error())
        d: defer.Deferred[None] = defer.Deferred()
        self._acked_waiters.append(d)
        return d

    # -- sending -----------------------------------------------------------------------------

    def _publish(self, message: tuple[Any, ...], timeout: float | None) -> defer.Deferred[int]:
        """A Deferred of the seq, fired once written: queued while the window is full (or
        the handshake not done), failed with :class:`MM2Timeout` after ``timeout``."""
        if self.closed or self.session.ended:
            return defer.fail(self.session.pending_error())
        prepared: Outgoing | tuple[Any, ...] = message
        if self.session.ready:
            prepared = self.session.prepare(*message)
        entry = _Publish(prepared, defer.Deferred())
        wait = self.timeout if timeout is None else timeout
        if wait is not None:
            entry.timer = self._clock().callLater(wait, self._publish_timed_out, entry, wait)
        self._queue.append(entry)
        self._drain()
        return entry.d

    def ack(self, message: Message) -> None:
        """With ``auto_ack=False``: ``message`` is handled; the acks cover it (and the
        earlier handled ones) from now on."""
        self._handled(message.seq)

    # -- the driver ----------------------------------------------------------------------------

    def _transport_data(self, unit: Any) -> None:
        self._receiving = True  # acks wait for the whole batch: one cumulative ack
        try:
            super()._transport_data(unit)
        finally:
            self._receiving = False
        if not self.closed and not self.session.ended and self.session.flush_acks() is not None:
            self._flush()

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, Message):
            self._deliver_message(event)
        elif isinstance(event, Acked):
            self._drain()
            self._check_acked()
        elif isinstance(event, Ready):
            self._became_ready()
        elif isinstance(event, ExtensionReceived):
            self._deliver(self.on_extension, event)

    def _became_ready(self) -> None:
        early, self._early = self._early, []
        for write in early:
            write()
        self._flush()  # the commands asked for early, right after step 3
        for entry in self._queue:
            if isinstance(entry.message, tuple):
                try:
                    entry.message = self.session.prepare(*entry.message)
                except (ValueError, TypeError, MM2Error) as e:
                    entry.message = e
        self._ready(self.session.active)
        self._drain()
        self._check_acked()

    def _deliver_message(self, message: Message) -> None:
        result = self._deliver(self.on_message, message)
        if not self.auto_ack:
            return
        if isinstance(result, defer.Deferred):
            result.addErrback(
                lambda f: self.log.failure("MM2 message handler failed on {m!r}", f, m=message)
            )
            result.addCallback(lambda _: self._handled(message.seq))
        else:
            self._handled(message.seq)

    def _handled(self, seq: int) -> None:
        self.session.done(seq)
        if not self._receiving and not self.closed:
            self.session.flush_acks()
            self._flush()

    def _command(self, write: Callable[[], object]) -> None:
        if self.closed or self.session.ended:
            raise self.session.pending_error()
        if not self.session.ready:
            self._early.append(write)
            return
        write()
        self._flush()

    def _drain(self) -> None:
        if self._draining or not self.session.ready:
            return
        self._draining = True
        try:
            while self._queue and self.session.has_room and not self.session.ended:
                entry = self._queue.popleft()
                self._cancel(entry.timer)
                message = entry.message
                if isinstance(message, BaseException):  # refused once the handshake was done
                    entry.d.errback(message)
                    continue
                assert isinstance(message, Outgoing)
                seq = self.session.send(message)
                self._flush()
                entry.d.callback(seq)
        finally:
            self._draining = False

    def _check_acked(self) -> None:
        if self._queue or self.session.unacked:
            return
        waiters, self._acked_waiters = self._acked_waiters, []
        for d in waiters:
            d.callback(None)

    def _publish_timed_out(self, entry: _Publish, wait: float) -> None:
        if entry in self._queue:
            self._queue.remove(entry)
            entry.d.errback(MM2Timeout(f"no room in the ack window within {wait:g} s"))

    def _fail_pending(self, error: BaseException) -> None:
        super()._fail_pending(error)
        queue, self._queue = self._queue, deque()
        for entry in queue:
            self._cancel(entry.timer)
            entry.d.errback(error)
        acked, self._acked_waiters = self._acked_waiters, []
        for d in acked:
            d.errback(error)
        self._early = []

    @staticmethod
    def _cancel(call: Any) -> None:
        if call is not None and call.active():
            call.cancel()


class ReconnectingMM2Client(MM2Commands, ReconnectingClient):
    """The Micromessage2 commands and publishes on the connection a
    :class:`~msgbroker.clientkit.reconnecting.ReconnectingClient` keeps up: the handshake
    and the subscriptions (queue groups and filters included) are made again after each
    reconnection (what ``connect(..., reconnect=...)`` gives). While reconnecting, a
    publish fails at once with :class:`MM2ConnectionClosed` and a command raises it, as do
    the ones queued or in flight when the connection drops (never sent again). Messages
    are acknowledged as :class:`MM2ClientProtocol` does with ``auto_ack`` (the default);
    ``close()`` stops it."""

    def when_acked(self) -> defer.Deferred[None]:
        return self._forward_deferred(lambda proto: proto.when_acked())

    def _command(self, write: Callable[[], object]) -> None:
        self._forward(lambda proto: proto._command(write))

    def _publish(self, message: tuple[Any, ...], timeout: float | None) -> defer.Deferred[int]:
        return self._forward_deferred(lambda proto: proto._publish(message, timeout))


class MM2ClientFactory(ClientFactory):
    """Builds :class:`MM2ClientProtocol` (or ``protocol_class``) with the given options."""

    protocol = MM2ClientProtocol


def connect(
    reactor: Any,
    endpoint_or_host: Any,
    port: int | None = None,
    *,
    identity: str,
    tls: Any = None,
    protocol_class: Any = None,
    connect_timeout: float = 30.0,
    reconnect: Reconnect | bool | None = None,
    **options: Any,
) -> defer.Deferred[Any]:
    """Connect and complete the handshake; a Deferred of the ready protocol — or, with
    ``reconnect`` (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`), of a
    :class:`ReconnectingMM2Client` that connects and subscribes again after each loss,
    with backoff.

    ``endpoint_or_host`` is a host name or address (with ``port``, default 4447) or any
    ``IStreamClientEndpoint``. ``tls`` is ``None`` for plain TCP, ``True`` to verify the
    server against the system's CAs, or a client connection creator such as
    :func:`client_tls_options`. ``options`` go to :class:`MM2ClientProtocol` (``required``,
    ``optional``, ``supported``, ``on_message``, ``timeout``, ...); its clock is
    ``reactor``. A refused handshake fails with :class:`MM2HandshakeRefused` or
    :class:`MM2ServerError`, and the connection is closed. With ``reconnect``,
    ``auto_ack=False`` is a ValueError.
    """
    where = DEFAULT_PORT if port is None else port
    endpoint = client_endpoint(reactor, endpoint_or_host, where, tls=tls, timeout=connect_timeout)
    options.setdefault("clock", reactor)
    if reconnect and not options.get("auto_ack", True):
        # which connection delivered a message, and so which one owes its ack, is gone
        raise ValueError("a reconnecting MM2 client acknowledges messages itself (auto_ack)")
    factory = MM2ClientFactory(protocol_class, identity=identity, **options)
    if reconnect:
        return connect_reconnecting(
            reactor, endpoint, factory, None, reconnect, ReconnectingMM2Client, connect_timeout
        )
    return connect_client(endpoint, factory, lambda proto: proto.when_ready())
