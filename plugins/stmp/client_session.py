"""The STMP client connection, sans-IO: :class:`STMPClientSession`, which both clients
drive through :mod:`msgbroker.clientkit` (the Twisted protocols in :mod:`.client`, the
blocking client in :mod:`.blocking`), on a wire that says how messages travel:
:class:`BinaryWire` (TCP: the binary serialization with PS) or :class:`WebSocketWire`
(WebSocket messages: the text serialization, or binary frames).

What it does: the version check first (id 0, action 0, the raw list of versions; requests
asked before the transport opened follow it), then requests with ids (1 to 65535, wrapping,
never one still pending or waiting out a late reply), each answered by its reply in any
order or, after its timeout, by a local ``0x25``; the heartbeat (a ping every
``heartbeat`` seconds, the end after two intervals without hearing from the server);
deliveries and other notifies as events; a request from the server answered ``0x24``.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from attrs import define, frozen

from msgbroker.clientkit.reconnect import Replay
from msgbroker.clientkit.session import ClientSession, SessionAttribute, Timers
from msgbroker.errors import RemoteProtocolError

from . import codec, payloads
from .client_common import (
    HEARTBEAT,
    REQUEST_TIMEOUT,
    BinaryWire,
    LateReplies,
    RequestIds,
    STMPConnectionClosed,
    STMPError,
    WebSocketWire,
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
from .codec import Encoding, Message, Notify, Ping, Request, Response, Status

Wire = BinaryWire | WebSocketWire

# -- events --------------------------------------------------------------------------------------


@frozen
class Ready:
    """The version check passed: the server chose ``version``."""

    version: tuple[int, int]


@frozen
class DroppedDelivery:
    """A delivery notify that does not parse (dropped; the Twisted client logs it)."""

    notify: Notify
    reason: str


# -- the session ---------------------------------------------------------------------------------

_VERSION, _HEARTBEAT = "version", "heartbeat"  # timer keys beside the request ids


@define
class _Pending:
    token: int
    kind: str  # "response": the Response itself; "result": the decoded payload; "login"
    asked: str | None = None  # the identity a login asked for
    accepted: Callable[[Any], object] | None = None  # what Ok does to the restorable state


class STMPClientSession(ClientSession):
    """One STMP client connection's state (see the module docstring). ``encoding`` (JSON or
    msgpack) is used by the broker actions and as the default of :meth:`request`;
    ``timeout`` is the default request timeout and the version check's, in seconds;
    ``heartbeat=None`` turns the heartbeat off. Events: :class:`Ready`,
    :class:`~.client_common.Delivery`, other notifies as :class:`~.codec.Notify`,
    :class:`DroppedDelivery`."""

    closed_error = STMPConnectionClosed

    def __init__(
        self,
        wire: Wire,
        *,
        encoding: int = Encoding.JSON,
        timeout: float = REQUEST_TIMEOUT,
        heartbeat: float | None = HEARTBEAT,
    ) -> None:
        super().__init__()
        self.wire = wire
        self.encoding = structured(encoding)
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.identity: str | None = None
        #: the STMP version the server chose, once the version check passed
        self.stmp_version: tuple[int, int] | None = None
        #: pings received from the server; replies dropped because their request timed out
        self.pings_received = 0
        self.late_replies = 0
        #: the request ids (tests move ``ids._next`` to show the wrap)
        self.ids = RequestIds()
        self._late = LateReplies()
        self._pending: dict[int, _Pending] = {}
        self._timers: Timers[int | str] = Timers()
        self._login: tuple[str, str, bytes | str | None] | None = None
        self._subscriptions: dict[str, bool] = {}  # topic: presence, in the order made
        self._last_heard = self._last_ping = 0.0

    @property
    def ready(self) -> bool:
        return self.stmp_version is not None

    def pending_error(self) -> BaseException:
        return self.closed()

    # -- requests: :class:`STMPRequests`' (each gives its token; ``now``: when it is asked) ----

    def request(self, now: float, action: int | str, *args: Any) -> int:
        """A request answered with its :class:`~.codec.Response` whatever the status (a
        local ``Response(id, 0x25)`` after its timeout); ``args``: payload, encoding,
        timeout. :class:`STMPError` (0x23) when all 65535 ids are in use."""
        return self._exchange("response", now, action, *args)

    def call(self, now: float, action: int | str, *args: Any) -> int:
        """:meth:`request` answered with the decoded payload on Ok, else failed."""
        return self._exchange("result", now, action, *args)

    def login(
        self,
        now: float,
        identity: str,
        scheme: str = "open",
        credential: bytes | str | None = None,
    ) -> int:
        def logged_in(identity_given: Any) -> None:
            self._login = identity, scheme, credential

        fields = login_fields(identity, scheme, credential)
        return self._exchange(
            "login", now, payloads.LOGIN, fields, asked=identity, accepted=logged_in
        )

    def subscribe(self, now: float, topic: str, presence: bool = False) -> int:
        fields: dict[str, Any] = {"topic": topic}
        if presence:
            fields["presence"] = True

        def subscribed(_: Any) -> None:
            self._subscriptions.pop(topic, None)
            self._subscriptions[topic] = presence

        return self._exchange("result", now, payloads.SUBSCRIBE, fields, accepted=subscribed)

    def unsubscribe(self, now: float, topic: str) -> int:
        return self._exchange(
            "result", now, payloads.UNSUBSCRIBE, {"topic": topic},
            accepted=lambda _: self._subscriptions.pop(topic, None),
        )  # fmt: skip

    def replay(self) -> list[Replay]:
        """The login the broker accepted, then the topics subscribed to."""
        items = []
        if self._login is not None:
            login = self._login
            items.append(
                Replay(f"login {login[0]}", lambda s, now: s.login(now, *login), login=True)
            )
        for topic, presence in self._subscriptions.items():
            items.append(Replay(f"subscribe {topic}", _subscribe(topic, presence)))
        return items

    def publish(self, now: float, topic: str, data: bytes) -> int:
        return self.call(now, payloads.PUBLISH, {"topic": topic, **self._data(data)})

    def unicast(self, now: float, to: str, data: bytes) -> int:
        return self.call(now, payloads.UNICAST, {"to": to, **self._data(data)})

    def broadcast(self, now: float, data: bytes) -> int:
        return self.call(now, payloads.BROADCAST, self._data(data))

    def _data(self, data: bytes) -> dict[str, Any]:
        return payloads.data_fields(data, self.encoding)

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """A notify (no reply)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        self.check_open()
        self._write(Notify(message.action, message.encoding, message.payload))

    def ping(self, now: float) -> None:
        """A heartbeat ping now (the server does not answer it)."""
        self.check_open()
        self._last_ping = now
        self._write(codec.PING)

    def _exchange(
        self,
        kind: str,
        now: float,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
        asked: str | None = None,
        accepted: Callable[[Any], object] | None = None,
    ) -> int:
        message = request_message(0, action, payload, encoding, self.encoding)
        self.check_open()
        ident = self.ids.take(_Busy(self._pending, self._late))
        token = self._token()
        self._pending[ident] = _Pending(token, kind, asked, accepted)
        self._timers.set(ident, now + (self.timeout if timeout is None else timeout))
        self._write(Request(ident, message.action, message.encoding, message.payload))
        return token

    def _write(self, message: Message, inline: bool | None = None) -> None:
        for unit in self.wire.encode(message, inline):
            self._send(unit)

    # -- the session -------------------------------------------------------------------------

    def _started(self, now: float) -> None:
        """The version check goes first, before what was asked while connecting."""
        self._last_heard = self._last_ping = now
        message, inline = version_request(self.wire.text)
        self._send_first(self.wire.encode(message, inline))
        self._timers.set(_VERSION, now + self.timeout)
        if self.heartbeat:
            self._timers.set(_HEARTBEAT, now + self.heartbeat)

    def next_tick(self) -> float | None:
        return self._timers.next_due()

    def _tick(self, now: float) -> None:
        for key in self._timers.expired(now):
            if self.ended:
                return
            if key == _HEARTBEAT:
                self._beat(now)
            elif key == _VERSION:
                if not self.ready:
                    text = "no reply to the version check"
                    self._end(STMPError(Status.REQUEST_TIMEOUT, text, local=True))
            else:
                self._timed_out(int(key), now)

    def _beat(self, now: float) -> None:
        """Ping every ``heartbeat`` s; give up after two intervals of silence."""
        interval = self.heartbeat
        assert interval
        if now - self._last_heard >= 2 * interval:
            self._end(STMPConnectionClosed(f"nothing from the server for {2 * interval:g} s"))
            return
        if now - self._last_ping >= interval:
            self._last_ping = now
            self._write(codec.PING)
        due = min(self._last_ping + interval, self._last_heard + 2 * interval)
        self._timers.set(_HEARTBEAT, due)

    def _timed_out(self, ident: int, now: float) -> None:
        entry = self._pending.pop(ident, None)
        if entry is None:
            return
        self._late.add(ident, now)
        if entry.kind == "response":
            self._answer(entry.token, timed_out(ident))
        else:
            self._fail(entry.token, STMPError(Status.REQUEST_TIMEOUT, None, local=True))

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        self._end(STMPConnectionClosed(f"protocol error from the server: {error}"))

    def _received(self, data: Any, now: float) -> None:
        self._last_heard = now
        for message in self.wire.decode(data):
            kind = type(message)
            if kind is Response:
                self._response(message)  # type: ignore[arg-type]
            elif kind is Notify:
                self._notified(message)  # type: ignore[arg-type]
            elif kind is Ping:
                self.pings_received += 1
            else:  # a request from the server: we route nothing
                self._write(Response(message.id, Status.NOT_FOUND))  # type: ignore[union-attr]
            if self.ended:
                return

    def _response(self, response: Response) -> None:
        if response.id == 0 and not self.ready:
            self._timers.cancel(_VERSION)
            try:
                self.stmp_version = accepted_version(response, self.wire.text)
            except (STMPError, RemoteProtocolError) as e:
                self._end(e)
                return
            self._emit(Ready(self.stmp_version))
            return
        entry = self._pending.pop(response.id, None)
        if entry is not None:
            self._timers.cancel(response.id)
            self._answered(entry, response)
        elif self._late.claim(response.id):
            self.late_replies += 1
        # else: a reply to no request, ignored

    def _answered(self, entry: _Pending, response: Response) -> None:
        if entry.kind == "response":
            self._answer(entry.token, response)
            return
        try:
            value = result_of(response)
        except STMPError as e:
            self._fail(entry.token, e)
            return
        if entry.accepted is not None:
            entry.accepted(value)
        if entry.kind == "login":
            assert entry.asked is not None
            self.identity = logged_in_as(entry.asked, value)
            value = None
        self._answer(entry.token, value)

    def _notified(self, notify: Notify) -> None:
        if notify.action != payloads.DELIVERY:
            self._emit(notify)
            return
        try:
            self._emit(delivery_of(notify))
        except ValueError as e:
            self._emit(DroppedDelivery(notify, str(e)))



def _subscribe(topic: str, presence: bool) -> Callable[[STMPClientSession, float], int]:
    return lambda session, now: session.subscribe(now, topic, presence)


class STMPRequests:
    r"""The STMP requests, once for both clients: each asks :attr:`session` and
    :meth:`_perform`\ s it (``ask(now)`` returns the request's token) — the Twisted client
    returns a Deferred of the answer, the blocking client waits for it and returns it (or
    raises). Bad actions or payloads raise ``ValueError`` at once."""

    session: STMPClientSession

    def _perform(self, ask: Callable[[float], int]) -> Any:
        raise NotImplementedError

    def _perform_write(self, write: Callable[[float], None]) -> None:
        """``write(now)`` makes the session write something that gets no answer."""
        raise NotImplementedError

    identity = SessionAttribute("the identity logged in as")
    stmp_version = SessionAttribute(
        "the version the server chose, once the version check passed (not ``version``: "
        "autobahn's protocol uses that for the WebSocket version)"
    )
    pings_received = SessionAttribute("pings received from the server")
    late_replies = SessionAttribute("replies that came after their request timed out (dropped)")
    encoding = SessionAttribute("the payload encoding of the broker actions")
    heartbeat = SessionAttribute("the heartbeat interval (None: no heartbeat)")

    def request(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """A request to ``action`` (int or dotted ``"a.b.c.d"``); its
        :class:`~.codec.Response`, whatever the status, or a local ``Response(id, 0x25)``
        after ``timeout`` seconds (default: the client's) without one. ``payload``: None (no
        payload), bytes (sent as they are, with ``encoding`` or raw) or a value (serialized
        with ``encoding``, default the client's)."""
        return self._perform(
            lambda now: self.session.request(now, action, payload, encoding, timeout)
        )

    def call(
        self, action: int | str, payload: Any = None, encoding: int | None = None,
        timeout: float | None = None,
    ) -> Any:  # fmt: skip
        """:meth:`request`, giving the decoded reply payload (None if none) on Ok and
        :class:`STMPError` otherwise (``local=True`` for a timeout)."""
        return self._perform(
            lambda now: self.session.call(now, action, payload, encoding, timeout)
        )

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | str | None = None
    ) -> Any:
        return self._perform(lambda now: self.session.login(now, identity, scheme, credential))

    def subscribe(self, topic: str, presence: bool = False) -> Any:
        return self._perform(lambda now: self.session.subscribe(now, topic, presence))

    def unsubscribe(self, topic: str) -> Any:
        return self._perform(lambda now: self.session.unsubscribe(now, topic))

    def publish(self, topic: str, data: bytes) -> Any:
        return self._perform(lambda now: self.session.publish(now, topic, data))

    def unicast(self, to: str, data: bytes) -> Any:
        return self._perform(lambda now: self.session.unicast(now, to, data))

    def broadcast(self, data: bytes) -> Any:
        return self._perform(lambda now: self.session.broadcast(now, data))

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """Send a notify (no reply)."""
        self._perform_write(lambda now: self.session.notify(action, payload, encoding))

    def ping(self) -> None:
        """Send a heartbeat ping now (the server does not answer it)."""
        # the session asked at the time: after a reconnection it is another one
        self._perform_write(lambda now: self.session.ping(now))  # noqa: PLW0108


class _Busy:
    """The ids a new request may not take: pending ones and timed-out ones."""

    def __init__(self, pending: Container[int], late: LateReplies) -> None:
        self._pending = pending
        self._late = late

    def __contains__(self, ident: object) -> bool:
        return ident in self._pending or ident in self._late


__all__ = ["DroppedDelivery", "Ready", "STMPClientSession", "STMPRequests"]
