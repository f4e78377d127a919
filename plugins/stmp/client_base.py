"""The Twisted STMP client's logic, whatever the transport (:class:`STMPClientBase`); the
TCP and WebSocket protocols in :mod:`.client` and :mod:`.client_ws` mix it in, and
:mod:`.client` re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from msgbroker.errors import RemoteProtocolError

from . import codec, payloads
from .codec import Encoding, Message, Notify, Ping, Request, Response, Status
from .common import (
    HEARTBEAT,
    REQUEST_TIMEOUT,
    Delivery,
    LateReplies,
    RequestIds,
    STMPConnectionClosed,
    STMPError,
    accepted_version,
    delivery_of,
    logged_in_as,
    login_fields,
    request_message,
    result_of,
    structured,
    timed_out,
    version_request,
)

log = Logger(namespace="msgbroker.stmp.client")


class STMPClientBase:
    """The STMP client logic, whatever the transport: version check, requests with ids and
    timeouts, heartbeat, notifies and deliveries, the broker actions. A transport class
    mixes it in and provides :meth:`_write` (send one message), :meth:`_drop` (close the
    transport) and calls :meth:`_stmp_open`, :meth:`_stmp_received` and :meth:`_stmp_lost`.

    Events go to :meth:`on_delivery` (deliveries, notify ``0.0.1.16``) and :meth:`on_notify`
    (any other notify): override them or pass callables. ``clock`` drives timers (default:
    the global reactor); ``heartbeat=None`` turns the heartbeat off; ``encoding`` (JSON or
    msgpack) is used by the broker actions and as the default of :meth:`request`;
    ``timeout`` is the default request timeout in seconds.
    """

    #: True for the text serialization (the version list is hex)
    text_mode = False

    def __init__(
        self,
        clock: Any = None,
        heartbeat: float | None = HEARTBEAT,
        encoding: int = Encoding.JSON,
        timeout: float = REQUEST_TIMEOUT,
        on_delivery: Callable[[Delivery], object] | None = None,
        on_notify: Callable[[Notify], object] | None = None,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.heartbeat = heartbeat
        self.encoding = structured(encoding)
        self.timeout = timeout
        self._delivery_callback = on_delivery
        self._notify_callback = on_notify
        self.identity: str | None = None
        #: the STMP version the server chose, once the version check succeeded (not
        #: ``version``: autobahn's protocol uses that for the WebSocket version)
        self.stmp_version: tuple[int, int] | None = None
        #: pings received from the server
        self.pings_received = 0
        #: replies that came after their request had timed out (dropped)
        self.late_replies = 0
        self._ids = RequestIds()
        self._late = LateReplies()
        self._pending: dict[int, tuple[defer.Deferred[tuple[Response, bool]], Any]] = {}
        self._ready_waiters: list[defer.Deferred[tuple[int, int]]] = []
        self._close_waiters: list[defer.Deferred[BaseException]] = []
        self._version_timer: Any = None
        self._ready_failure: BaseException | None = None
        self._opened = False
        self._outbox: list[tuple[Message, bool | None]] = []
        self._lost = False
        self._failure: BaseException | None = None
        self._heartbeat_timer: Any = None
        self._last_heard = 0.0
        self._last_ping = 0.0

    # -- events (override) -------------------------------------------------------------------

    def on_delivery(self, delivery: Delivery) -> None:
        """A message routed to this client (mcast, ucast, bcast) or a presence event."""
        if self._delivery_callback is not None:
            self._delivery_callback(delivery)

    def on_notify(self, notify: Notify) -> None:
        """A notify other than a delivery (from a plugin's action)."""
        if self._notify_callback is not None:
            self._notify_callback(notify)

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> defer.Deferred[Response]:
        """Send a request to ``action`` (int or dotted ``"a.b.c.d"``); a Deferred of its
        :class:`Response`, whatever the status, or a local ``Response(id, 0x25)`` after
        ``timeout`` seconds (default: the protocol's) without one. ``payload``: ``None``
        (no payload), bytes (sent as they are, with ``encoding`` or raw) or a value
        (serialized with ``encoding``, default the protocol's). Bad actions or payloads
        raise ``ValueError`` at once."""
        return self._exchange(action, payload, encoding, timeout).addCallback(lambda r: r[0])

    def call(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> defer.Deferred[Any]:
        """:meth:`request`, firing with the decoded reply payload (``None`` if none) on Ok
        and failing with :class:`STMPError` otherwise (``local=True`` for a timeout)."""

        def result(exchange: tuple[Response, bool]) -> Any:
            response, local = exchange
            if local:
                raise STMPError(Status.REQUEST_TIMEOUT, None, local=True)
            return result_of(response)

        return self._exchange(action, payload, encoding, timeout).addCallback(result)

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | str | None = None
    ) -> defer.Deferred[None]:
        d = self.call(payloads.LOGIN, login_fields(identity, scheme, credential))

        def logged_in(result: Any) -> None:
            self.identity = logged_in_as(identity, result)

        return d.addCallback(logged_in)

    def subscribe(self, topic: str, presence: bool = False) -> defer.Deferred[Any]:
        fields: dict[str, Any] = {"topic": topic}
        if presence:
            fields["presence"] = True
        return self.call(payloads.SUBSCRIBE, fields)

    def unsubscribe(self, topic: str) -> defer.Deferred[Any]:
        return self.call(payloads.UNSUBSCRIBE, {"topic": topic})

    def publish(self, topic: str, data: bytes) -> defer.Deferred[Any]:
        fields = {"topic": topic, **payloads.data_fields(data, self.encoding)}
        return self.call(payloads.PUBLISH, fields)

    def unicast(self, to: str, data: bytes) -> defer.Deferred[Any]:
        return self.call(payloads.UNICAST, {"to": to, **payloads.data_fields(data, self.encoding)})

    def broadcast(self, data: bytes) -> defer.Deferred[Any]:
        return self.call(payloads.BROADCAST, payloads.data_fields(data, self.encoding))

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """Send a notify (no reply)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        self._stmp_send(Notify(message.action, message.encoding, message.payload))

    def ping(self) -> None:
        """Send a heartbeat ping now (the server does not answer it)."""
        self._stmp_send(codec.PING)

    def when_ready(self) -> defer.Deferred[tuple[int, int]]:
        """Fires with the version the server chose, or fails with :class:`STMPError`
        (0x35 VersionNotSupported, or 0x25 when the version check went unanswered) or
        :class:`STMPConnectionClosed`."""
        if self.stmp_version is not None:
            return defer.succeed(self.stmp_version)
        if self._ready_failure is not None:
            return defer.fail(self._ready_failure)
        d: defer.Deferred[tuple[int, int]] = defer.Deferred()
        self._ready_waiters.append(d)
        return d

    def when_closed(self) -> defer.Deferred[BaseException]:
        """Fires with the reason (an exception) when the connection is lost."""
        if self._lost:
            return defer.succeed(self._failure or STMPConnectionClosed("closed"))
        d: defer.Deferred[BaseException] = defer.Deferred()
        self._close_waiters.append(d)
        return d

    def close(self) -> defer.Deferred[None]:
        """Close the connection; fires once it is gone. Pending requests fail with
        :class:`STMPConnectionClosed`."""
        if self._lost:
            return defer.succeed(None)
        closed = self.when_closed()
        if self._failure is None:
            self._failure = STMPConnectionClosed("closed by the client")
        self._drop(abort=False)
        return closed.addCallback(lambda _: None)

    # -- plumbing ----------------------------------------------------------------------------

    def _exchange(
        self, action: int | str, payload: Any, encoding: int | None, timeout: float | None
    ) -> defer.Deferred[tuple[Response, bool]]:
        message = request_message(0, action, payload, encoding, self.encoding)
        if self._lost or self._failure is not None:
            return defer.fail(self._closed_error())
        try:
            ident = self._ids.take(_Busy(self._pending, self._late))
        except STMPError as e:
            return defer.fail(e)
        d: defer.Deferred[tuple[Response, bool]] = defer.Deferred()
        wait = self.timeout if timeout is None else timeout
        timer = self._clock().callLater(wait, self._timed_out, ident)
        self._pending[ident] = (d, timer)
        self._stmp_send(Request(ident, message.action, message.encoding, message.payload))
        return d

    def _timed_out(self, ident: int) -> None:
        entry = self._pending.pop(ident, None)
        if entry is None:
            return
        self._late.add(ident, self._clock().seconds())
        entry[0].callback((timed_out(ident), True))

    def _clock(self) -> Any:
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        return self.clock

    def _stmp_send(self, message: Message, inline: bool | None = None) -> None:
        if self._lost:
            return
        if not self._opened:
            self._outbox.append((message, inline))
            return
        self._write(message, inline)

    def _closed_error(self) -> BaseException:
        failure = self._failure
        if isinstance(failure, STMPConnectionClosed):
            return failure
        return STMPConnectionClosed(str(failure) if failure else "the connection is closed")

    # -- for the transport ---------------------------------------------------------------------

    def _write(self, message: Message, inline: bool | None) -> None:
        raise NotImplementedError

    def _drop(self, abort: bool) -> None:
        raise NotImplementedError

    def _stmp_open(self) -> None:
        """The transport can carry messages: send the version check (then anything queued)
        and start the heartbeat."""
        clock = self._clock()
        self._opened = True
        now = clock.seconds()
        self._last_heard = self._last_ping = now
        message, inline = version_request(self.text_mode)
        self._write(message, inline)
        self._version_timer = clock.callLater(self.timeout, self._version_timed_out)
        outbox, self._outbox = self._outbox, []
        for queued, queued_inline in outbox:
            self._write(queued, queued_inline)
        if self.heartbeat:
            self._heartbeat_timer = clock.callLater(self.heartbeat, self._beat)

    def _stmp_received(self, message: Message) -> None:
        if self._lost:
            return
        self._last_heard = self._clock().seconds()
        kind = type(message)
        if kind is Response:
            self._response(message)  # type: ignore[arg-type]
        elif kind is Notify:
            self._notified(message)  # type: ignore[arg-type]
        elif kind is Ping:
            self.pings_received += 1
        else:  # a request from the server: we route nothing
            self._stmp_send(Response(message.id, Status.NOT_FOUND))  # type: ignore[union-attr]

    def _response(self, response: Response) -> None:
        if response.id == 0 and self.stmp_version is None and self._ready_failure is None:
            self._version_reply(response)
            return
        entry = self._pending.pop(response.id, None)
        if entry is not None:
            d, timer = entry
            if timer.active():
                timer.cancel()
            d.callback((response, False))
        elif self._late.claim(response.id):
            self.late_replies += 1
            log.debug("STMP late reply to request {id} dropped", id=response.id)
        else:
            log.debug("STMP reply to no request ({id}) ignored", id=response.id)

    def _version_reply(self, response: Response) -> None:
        self._cancel(self._version_timer)
        try:
            self.stmp_version = accepted_version(response, self.text_mode)
        except (STMPError, RemoteProtocolError) as e:
            self._not_ready(e)
            self._abort(e)
            return
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(self.stmp_version)

    def _version_timed_out(self) -> None:
        self._version_timer = None
        if self.stmp_version is None and self._ready_failure is None:
            error = STMPError(Status.REQUEST_TIMEOUT, "no reply to the version check", local=True)
            self._not_ready(error)
            self._abort(error)

    def _not_ready(self, error: BaseException) -> None:
        if self._ready_failure is None:
            self._ready_failure = error
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(error)

    def _notified(self, notify: Notify) -> None:
        if notify.action == payloads.DELIVERY:
            try:
                delivery = delivery_of(notify)
            except ValueError as e:
                log.warn("STMP malformed delivery dropped: {why}", why=str(e))
                return
            self._event(self.on_delivery, delivery)
        else:
            self._event(self.on_notify, notify)

    def _event(self, handler: Callable[[Any], object], event: Any) -> None:
        try:
            handler(event)
        except Exception:
            log.failure("STMP event handler failed on {event!r}", event=event)

    def _beat(self) -> None:
        """Ping every ``heartbeat`` s; give up after two intervals of silence."""
        self._heartbeat_timer = None
        interval = self.heartbeat
        assert interval
        now = self._clock().seconds()
        if now - self._last_heard >= 2 * interval:
            self._abort(STMPConnectionClosed(f"nothing from the server for {2 * interval:g} s"))
            return
        if now - self._last_ping >= interval:
            self._last_ping = now
            self._write(codec.PING, None)
        due = min(self._last_ping + interval, self._last_heard + 2 * interval)
        self._heartbeat_timer = self._clock().callLater(max(due - now, 0), self._beat)

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        self._abort(STMPConnectionClosed(f"protocol error from the server: {error}"))

    def _abort(self, reason: BaseException) -> None:
        """Close at once, failing what is pending with ``reason``."""
        if self._lost:
            return
        if self._failure is None:
            self._failure = reason
        log.info("STMP client closing the connection: {reason}", reason=reason)
        self._fail_pending()
        self._drop(abort=True)

    def _fail_pending(self) -> None:
        error = self._closed_error()
        pending, self._pending = self._pending, {}
        for d, timer in pending.values():
            self._cancel(timer)
            d.errback(error)
        self._not_ready(self._failure if self._failure is not None else error)

    @staticmethod
    def _cancel(call: Any) -> None:
        if call is not None and call.active():
            call.cancel()

    def _stmp_lost(self, reason: Failure | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._cancel(self._heartbeat_timer)
        self._cancel(self._version_timer)
        self._heartbeat_timer = self._version_timer = None
        if self._failure is None:
            text = reason.getErrorMessage() if reason is not None else "connection lost"
            self._failure = STMPConnectionClosed(text)
        if self.stmp_version is None and self._ready_failure is None:
            self._not_ready(self._closed_error())
        self._fail_pending()
        waiters, self._close_waiters = self._close_waiters, []
        for d in waiters:
            d.callback(self._failure)


class _Busy:
    """The ids a new request may not take: pending ones and timed-out ones."""

    def __init__(self, pending: dict[int, Any], late: LateReplies) -> None:
        self._pending = pending
        self._late = late

    def __contains__(self, ident: object) -> bool:
        return ident in self._pending or ident in self._late
