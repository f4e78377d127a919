"""The Twisted Micromessage2 client protocol (:class:`MM2ClientProtocol`), driving the
sans-IO :class:`~.client_session.ClientSession`. :mod:`.client` describes the clients,
builds connections (:func:`~.client.connect`) and re-exports this; import from there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from .client_common import (
    DEFAULT_OPTIONAL,
    DEFAULT_REQUIRED,
    TIMEOUT,
    ExtensionSpec,
    Message,
    MM2ConnectionClosed,
    MM2Error,
    MM2Timeout,
)
from .client_session import Acked, ClientSession, Closed, ExtensionReceived, Outgoing, Ready
from .codec import (
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MAX_PAYLOAD,
    FRAGMENT_SIZE,
    ActiveExtensions,
    Command,
    Filter,
    PropertyValue,
)

log = Logger(namespace="msgbroker.mm2.client")


class _Publish:
    """A publish waiting for the handshake or for room in the window."""

    def __init__(self, message: Outgoing | tuple[Any, ...], d: defer.Deferred[int]) -> None:
        # a tuple: the arguments, checked once the handshake is done (then an Outgoing, or
        # the exception that refused it)
        self.message: Outgoing | tuple[Any, ...] | BaseException = message
        self.d = d
        self.timer: Any = None


class MM2ClientProtocol(Protocol):
    """A Micromessage2 client connection; see the module's description. The handshake
    starts on connecting; :meth:`when_ready` fires with the active extensions.

    ``identity``, ``required``, ``optional``, ``supported`` and ``accept_suggested`` are
    :class:`~.client_session.ClientSession`'s. ``clock`` drives the timeouts (default: the
    global reactor); ``timeout`` bounds the handshake and a publish's wait for room (None:
    no bound). Events: :meth:`on_message` and :meth:`on_extension` (EXTENSION frames of
    active extensions without a built-in meaning, such as vendor ``x-...`` ones).
    """

    transport: Any  # an ITransport; typed loosely as Twisted's interfaces confuse mypy

    def __init__(
        self,
        identity: str = "",
        required: Iterable[ExtensionSpec] = DEFAULT_REQUIRED,
        optional: Iterable[ExtensionSpec] = DEFAULT_OPTIONAL,
        *,
        supported: Iterable[str] = (),
        accept_suggested: bool = False,
        clock: Any = None,
        timeout: float | None = TIMEOUT,
        auto_ack: bool = True,
        on_message: Callable[[Message], object] | None = None,
        on_extension: Callable[[ExtensionReceived], object] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_message: int = DEFAULT_MAX_MESSAGE,
        fragment_size: int = FRAGMENT_SIZE,
    ) -> None:
        self.session = ClientSession(
            identity,
            required,
            optional,
            supported=supported,
            accept_suggested=accept_suggested,
            max_payload=max_payload,
            max_message=max_message,
            fragment_size=fragment_size,
        )
        self.clock = clock
        self.timeout = timeout
        self.auto_ack = auto_ack
        self._message_callback = on_message
        self._extension_callback = on_extension
        self._queue: deque[_Publish] = deque()
        self._early: list[Callable[[], None]] = []  # commands asked for before ready
        self._ready_waiters: list[defer.Deferred[ActiveExtensions]] = []
        self._acked_waiters: list[defer.Deferred[None]] = []
        self._close_waiters: list[defer.Deferred[BaseException]] = []
        self._handshake_timer: Any = None
        self._failure: BaseException | None = None
        self._lost = False
        self._receiving = False
        self._draining = False

    # -- events (override) -------------------------------------------------------------------

    def on_message(self, message: Message) -> object:
        """A message the server delivered. A Deferred returned delays its ack."""
        if self._message_callback is not None:
            return self._message_callback(message)
        return None

    def on_extension(self, event: ExtensionReceived) -> None:
        if self._extension_callback is not None:
            self._extension_callback(event)

    # -- state -------------------------------------------------------------------------------

    @property
    def active(self) -> ActiveExtensions:
        return self.session.active

    @property
    def unacked(self) -> int:
        """Published messages written and not yet acknowledged by the server."""
        return self.session.unacked

    @property
    def queued(self) -> int:
        """Publishes waiting for room in the window (or for the handshake)."""
        return len(self._queue)

    def when_ready(self) -> defer.Deferred[ActiveExtensions]:
        """Fires with the active extensions once step 3 is written; fails with
        :class:`MM2HandshakeRefused`, :class:`MM2ServerError`, :class:`MM2Timeout` or
        :class:`MM2ConnectionClosed`."""
        if self.session.ready:
            return defer.succeed(self.session.active)
        if self._failure is not None or self._lost:
            return defer.fail(self._error())
        d: defer.Deferred[ActiveExtensions] = defer.Deferred()
        self._ready_waiters.append(d)
        return d

    def when_acked(self) -> defer.Deferred[None]:
        """Fires when no publish is queued and the server acknowledged every message."""
        if not self._queue and not self.session.unacked and self.session.ready:
            return defer.succeed(None)
        if self._failure is not None or self._lost:
            return defer.fail(self._error())
        d: defer.Deferred[None] = defer.Deferred()
        self._acked_waiters.append(d)
        return d

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires with the reason (an exception) when the connection is gone."""
        if self._lost:
            return defer.succeed(self._error())
        d: defer.Deferred[BaseException] = defer.Deferred()
        self._close_waiters.append(d)
        return d

    # -- sending -----------------------------------------------------------------------------

    def publish(
        self,
        destination: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        *,
        type_name: str | None = None,
        timeout: float | None = None,
    ) -> defer.Deferred[int]:
        """Send a MESSAGE; a Deferred of its seq, fired once written. ``payload`` is bytes,
        or with ``json`` active any JSON value; ``type_name`` needs ``dotnet``. ValueError
        or TypeError at once for what cannot be sent; :class:`MM2Timeout` when it waited
        ``timeout`` seconds (default: the protocol's) for room in the window."""
        if self._failure is not None or self._lost:
            return defer.fail(self._error())
        message: Outgoing | tuple[Any, ...] = (destination, payload, properties, type_name)
        if self.session.ready:
            message = self.session.prepare(destination, payload, properties, type_name)
        entry = _Publish(message, defer.Deferred())
        wait = self.timeout if timeout is None else timeout
        if wait is not None:
            entry.timer = self._clock().callLater(wait, self._publish_timed_out, entry, wait)
        self._queue.append(entry)
        self._drain()
        return entry.d

    def unicast(
        self,
        identity: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        **kw: Any,
    ) -> defer.Deferred[int]:
        """:meth:`publish` to ``@identity``."""
        return self.publish(f"@{identity}", payload, properties, **kw)

    def subscribe(
        self, destination: str, queue: str | None = None, filters: Iterable[Filter | str] = ()
    ) -> None:
        """Write a ``subscribe`` command; filters are :class:`Filter` values or their text
        (``"price>=N10"``). Effective before any later frame; no reply comes."""
        filters = tuple(filters)
        self._command(lambda: self.session.subscribe(destination, queue, filters))

    def unsubscribe(self, destination: str) -> None:
        self._command(lambda: self.session.unsubscribe(destination))

    def command(self, command: Command) -> None:
        """Write any COMMAND frame."""
        self._command(lambda: self.session.command(command))

    def send_extension(self, name: str, payload: bytes) -> None:
        """Write an EXTENSION frame of the active extension ``name``."""
        self._command(lambda: self.session.send_extension(name, payload))

    def ack(self, message: Message) -> None:
        """With ``auto_ack=False``: ``message`` is handled; the acks cover it (and the
        earlier handled ones) from now on."""
        self._handled(message.seq)

    def close(self) -> defer.Deferred[None]:
        """Close the connection; fires once it is gone. What is pending fails with
        :class:`MM2ConnectionClosed`."""
        if self._lost:
            return defer.succeed(None)
        closed = self.when_closed()
        if self._failure is None:
            self._failure = MM2ConnectionClosed("closed by the client")
        self._fail_pending()
        self.transport.loseConnection()
        return closed.addCallback(lambda _: None)

    # -- Twisted -----------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._flush()
        if self.timeout is not None:
            self._handshake_timer = self._clock().callLater(self.timeout, self._no_handshake)

    def dataReceived(self, data: bytes) -> None:
        if self._lost or self._failure is not None:
            return
        self._receiving = True
        try:
            for event in self.session.receive(data):
                self._event(event)
        finally:
            self._receiving = False
        if self._failure is None:
            self.session.flush_acks()
        self._flush()
        if self.session.state == "closed" and not self._lost:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._lost:
            return
        self._lost = True
        self.session.lost()
        self._cancel(self._handshake_timer)
        if self._failure is None:
            text = reason.getErrorMessage() if reason is not None else "connection lost"
            self._failure = MM2ConnectionClosed(text)
        self._fail_pending()
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self._failure)

    # -- plumbing ----------------------------------------------------------------------------

    def _event(self, event: Any) -> None:
        if isinstance(event, Message):
            self._deliver(event)
        elif isinstance(event, Acked):
            self._drain()
            self._check_acked()
        elif isinstance(event, Ready):
            self._ready()
        elif isinstance(event, ExtensionReceived):
            self._call(self.on_extension, event)
        elif isinstance(event, Closed):
            log.info("MM2 client: the connection ends: {why}", why=str(event.error))
            self._failure = event.error
            self._flush()  # our ERROR frame, if we refused, before anyone reacts
            self.transport.loseConnection()
            self._fail_pending()

    def _ready(self) -> None:
        self._cancel(self._handshake_timer)
        self._flush()  # step 3 before anything else
        early, self._early = self._early, []
        for write in early:
            write()
        for entry in self._queue:
            if isinstance(entry.message, tuple):
                try:
                    entry.message = self.session.prepare(*entry.message)
                except (ValueError, TypeError, MM2Error) as e:
                    entry.message = e
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(self.session.active)
        self._drain()
        self._check_acked()

    def _deliver(self, message: Message) -> None:
        result = self._call(self.on_message, message)
        if not self.auto_ack:
            return
        if isinstance(result, defer.Deferred):
            result.addErrback(
                lambda f: log.failure("MM2 message handler failed on {m!r}", f, m=message)
            )
            result.addCallback(lambda _: self._handled(message.seq))
        else:
            self._handled(message.seq)

    def _handled(self, seq: int) -> None:
        self.session.done(seq)
        if not self._receiving and not self._lost:
            self.session.flush_acks()
            self._flush()

    def _call(self, handler: Callable[[Any], Any], event: Any) -> Any:
        try:
            return handler(event)
        except Exception:
            log.failure("MM2 event handler failed on {event!r}", event=event)
            return None

    def _command(self, write: Callable[[], None]) -> None:
        if self._failure is not None or self._lost:
            raise self._error()
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
            while self._queue and self.session.has_room and self._failure is None:
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

    def _no_handshake(self) -> None:
        self._handshake_timer = None
        if self.session.state == "handshake" and self._failure is None:
            self._failure = MM2Timeout(f"no handshake reply within {self.timeout:g} s")
            self._fail_pending()
            self.transport.abortConnection()

    def _flush(self) -> None:
        data = self.session.data_to_send()
        if data and not self._lost:
            self.transport.write(data)

    def _error(self) -> BaseException:
        return self._failure or MM2ConnectionClosed("the connection is closed")

    def _fail_pending(self) -> None:
        error = self._error()
        self._cancel(self._handshake_timer)
        queue, self._queue = self._queue, deque()
        for entry in queue:
            self._cancel(entry.timer)
            entry.d.errback(error)
        ready, self._ready_waiters = self._ready_waiters, []
        acked, self._acked_waiters = self._acked_waiters, []
        for ready_d in ready:
            ready_d.errback(error)
        for acked_d in acked:
            acked_d.errback(error)
        self._early = []

    def _clock(self) -> Any:
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        return self.clock

    @staticmethod
    def _cancel(call: Any) -> None:
        if call is not None and call.active():
            call.cancel()
