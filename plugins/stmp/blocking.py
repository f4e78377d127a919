"""The blocking STMP client — over TCP (binary serialization) or WebSocket (text
serialization, on a small RFC 6455 client on a plain socket, in :mod:`.blocking_ws`: no
reactor, no extra dependency). What both STMP clients share is in :mod:`.common`; this
module re-exports the public part of it. :mod:`msgbroker.plugins.stmp.client` re-exports
the client and those shared names; import from there.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from msgbroker.errors import RemoteProtocolError

from . import codec, payloads
from .blocking_ws import WebSocketReader, _WebSocketWire, ws_frame, ws_mask
from .codec import Encoding, Message, Notify, Ping, Request, Response, Status
from .common import (
    DEFAULT_PORT,
    DEFAULT_WS_PORT,
    HEARTBEAT,
    REQUEST_TIMEOUT,
    Delivery,
    LateReplies,
    RequestIds,
    STMPConnectionClosed,
    STMPError,
    accepted_version,
    decoded,
    delivery_of,
    logged_in_as,
    login_fields,
    request_message,
    result_of,
    status_name,
    structured,
    timed_out,
    version_request,
)

# WebSocketReader, decoded, ws_frame and ws_mask moved to blocking_ws and common; they stay
# importable from here, where code outside the package imported them before.
__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_WS_PORT",
    "HEARTBEAT",
    "REQUEST_TIMEOUT",
    "BlockingSTMPClient",
    "Delivery",
    "STMPConnectionClosed",
    "STMPError",
    "WebSocketReader",
    "decoded",
    "status_name",
    "ws_frame",
    "ws_mask",
]


# -- wires: bytes <-> messages ----------------------------------------------------------------


class _TCPWire:
    """Binary serialization with PS on a stream socket."""

    text = False

    def __init__(self, sock: socket.socket, max_payload: int) -> None:
        self.sock = sock
        self._decoder = codec.BinaryDecoder(max_payload)

    def send(self, message: Message, inline: bool | None = None) -> None:
        self.sock.sendall(codec.encode_binary(message))

    def feed(self, data: bytes) -> list[Message]:
        return list(self._decoder.feed(data))

    def goodbye(self) -> None:
        pass


# -- the blocking client ------------------------------------------------------------------------


class BlockingSTMPClient:
    """A blocking STMP client over TCP (binary) or WebSocket (``ws=True``: text frames, or
    binary frames with ``binary_frames=True``), plain or TLS (``ssl_context``). The version
    check runs on construction, then the login when ``identity`` is given. Not thread-safe.

    :meth:`request` sends any request and returns the :class:`Response`; when none came
    within ``timeout`` it returns a local ``0x25`` RequestTimeout reply and the late reply
    is dropped when it comes (the connection stays usable). :meth:`call` and the broker
    actions (:meth:`login`, :meth:`subscribe`, :meth:`publish`, ...) return the decoded
    reply payload and raise :class:`STMPError` for any status but Ok (0x25 included).
    Deliveries and other notifies that arrive meanwhile are queued for
    :meth:`next_delivery` / :meth:`next_notify`.

    The heartbeat runs whenever the client reads: it pings every ``heartbeat`` seconds and
    gives up after two intervals without a byte from the server. A program that does not
    read for longer than that should call :meth:`poll` now and then. ``clock`` is where
    the time comes from (``time.monotonic``).
    """

    def __init__(
        self,
        host: str,
        port: int | None = None,
        identity: str | None = None,
        scheme: str = "open",
        credential: bytes | str | None = None,
        *,
        ws: bool = False,
        path: str = "/",
        binary_frames: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        encoding: int = Encoding.JSON,
        timeout: float = REQUEST_TIMEOUT,
        heartbeat: float | None = HEARTBEAT,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: what the heartbeat and the timeouts read the time from (tests pass a fake)
        self._now = clock
        self.encoding = structured(encoding)
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.identity: str | None = None
        self.stmp_version: tuple[int, int] | None = None
        self.closed = False
        #: pings received from the server
        self.pings_received = 0
        #: late replies dropped (their request had timed out)
        self.late_replies = 0
        port = port if port is not None else (DEFAULT_WS_PORT if ws else DEFAULT_PORT)
        self._deliveries: deque[Delivery] = deque()
        self._notifies: deque[Notify] = deque()
        self._ids = RequestIds()
        self._late = LateReplies()
        self._waiting: int | None = None
        self._reply: Response | None = None
        deadline = self._now() + timeout
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
            self._wire: _TCPWire | _WebSocketWire
            if ws:
                self._wire = _WebSocketWire(
                    sock, host, port, path, max_payload, binary_frames, deadline
                )
            else:
                self._wire = _TCPWire(sock, max_payload)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        now = self._now()
        self._last_heard = self._last_ping = now
        try:
            early = self._wire.pending_bytes() if isinstance(self._wire, _WebSocketWire) else b""
            if early:
                self._handle_bytes(early)
            self.stmp_version = self._check_version()
            if identity is not None:
                self.login(identity, scheme, credential)
        except BaseException:
            self._shut()
            raise

    def __enter__(self) -> BlockingSTMPClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send a request to ``action`` (an int or dotted ``"a.b.c.d"``) and wait for its
        reply. ``payload``: ``None`` (none), bytes (sent as they are, encoding ``encoding``
        or raw) or a value (serialized with ``encoding``, default the client's). A local
        ``Response(id, 0x25)`` when no reply came within ``timeout``."""
        return self._exchange(action, payload, encoding, timeout)[0]

    def call(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """:meth:`request`, then the decoded reply payload (``None`` if none);
        :class:`STMPError` unless the status is Ok (``local`` set for a timeout)."""
        response, local = self._exchange(action, payload, encoding, timeout)
        if local:
            raise STMPError(Status.REQUEST_TIMEOUT, None, local=True)
        return result_of(response)

    def _exchange(
        self, action: int | str, payload: Any, encoding: int | None, timeout: float | None
    ) -> tuple[Response, bool]:
        """(reply, True if it is the local 0x25)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        ident = self._ids.take(self._late)
        self._send(Request(ident, message.action, message.encoding, message.payload))
        self._waiting, self._reply = ident, None
        deadline = self._now() + (self.timeout if timeout is None else timeout)
        try:
            while self._reply is None:
                if not self._receive(deadline):
                    self._late.add(ident, self._now())
                    return timed_out(ident), True
            return self._reply, False
        finally:
            self._waiting, self._reply = None, None

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | str | None = None
    ) -> None:
        result = self.call(payloads.LOGIN, login_fields(identity, scheme, credential))
        self.identity = logged_in_as(identity, result)

    def subscribe(self, topic: str, presence: bool = False) -> None:
        fields: dict[str, Any] = {"topic": topic}
        if presence:
            fields["presence"] = True
        self.call(payloads.SUBSCRIBE, fields)

    def unsubscribe(self, topic: str) -> None:
        self.call(payloads.UNSUBSCRIBE, {"topic": topic})

    def publish(self, topic: str, data: bytes) -> None:
        self.call(payloads.PUBLISH, {"topic": topic, **payloads.data_fields(data, self.encoding)})

    def unicast(self, to: str, data: bytes) -> None:
        self.call(payloads.UNICAST, {"to": to, **payloads.data_fields(data, self.encoding)})

    def broadcast(self, data: bytes) -> None:
        self.call(payloads.BROADCAST, payloads.data_fields(data, self.encoding))

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """Send a notify (no reply)."""
        message = request_message(0, action, payload, encoding, self.encoding)
        self._send(Notify(message.action, message.encoding, message.payload))

    def ping(self) -> None:
        """Send a heartbeat ping now (the server does not answer it)."""
        self._send(codec.PING)
        self._last_ping = self._now()

    def close(self) -> None:
        """Close the connection (over WebSocket with the closing handshake, waiting up to 2 s
        for the server's close). Never raises; does nothing when already closed."""
        if self.closed:
            return
        try:
            if isinstance(self._wire, _WebSocketWire):
                self._wire.goodbye()
                deadline = self._now() + min(self.timeout, 2.0)
                while not self._wire.closed_by_server and self._receive(deadline):
                    pass
        except (OSError, STMPConnectionClosed, RemoteProtocolError):
            pass
        finally:
            self._shut()

    # -- incoming ----------------------------------------------------------------------------

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery (queued or read now), or ``None`` after ``timeout`` seconds
        (``None``: wait as long as it takes; ``0``: only what was already read). Raises
        :class:`STMPConnectionClosed` if the connection ends."""
        return self._next(self._deliveries, timeout)

    def next_notify(self, timeout: float | None = None) -> Notify | None:
        """The next notify that is not a delivery (a plugin's), like :meth:`next_delivery`."""
        return self._next(self._notifies, timeout)

    def deliveries(self) -> Iterator[Delivery]:
        """Every delivery, as it arrives, until the connection ends (which raises)."""
        while True:
            delivery = self.next_delivery()
            if delivery is not None:
                yield delivery

    def poll(self) -> None:
        """Handle whatever already arrived and send the heartbeat if due, without waiting.
        Raises :class:`STMPConnectionClosed` if the connection ended."""
        while self._receive(self._now(), poll=True):
            pass

    def _next(self, queue: deque[Any], timeout: float | None) -> Any:
        deadline = None if timeout is None else self._now() + timeout
        while not queue:
            if not self._receive(deadline):
                return None
        return queue.popleft()

    # -- plumbing ----------------------------------------------------------------------------

    def _check_version(self) -> tuple[int, int]:
        message, inline = version_request(self._wire.text)
        self._send(message, inline)
        self._waiting, self._reply = 0, None
        deadline = self._now() + self.timeout
        try:
            while self._reply is None:
                if not self._receive(deadline):
                    raise STMPError(
                        Status.REQUEST_TIMEOUT, "no reply to the version check", local=True
                    )
            return accepted_version(self._reply, self._wire.text)
        finally:
            self._waiting, self._reply = None, None

    def _send(self, message: Message, inline: bool | None = None) -> None:
        if self.closed:
            raise STMPConnectionClosed("the connection is closed")
        try:
            self._wire.send(message, inline)
        except OSError as e:
            self._shut()
            raise STMPConnectionClosed(f"cannot send: {e}") from e

    def _receive(self, deadline: float | None, poll: bool = False) -> bool:
        """Read and handle one chunk; False if ``deadline`` passed first (``poll``: read
        only what is there). Sends the heartbeat ping when due."""
        while True:
            if self.closed:
                raise STMPConnectionClosed("the connection is closed")
            now = self._now()
            wake = self._beat(now)
            if deadline is not None and now >= deadline and not poll:
                return False
            wait: float | None = 0.0
            if not poll:
                wakes = [t for t in (wake, deadline) if t is not None]
                wait = max(min(wakes) - now, 0.001) if wakes else None
            self._sock.settimeout(wait)
            try:
                data = self._sock.recv(65536)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                if poll:
                    return False
                continue
            except OSError as e:
                self._shut()
                raise STMPConnectionClosed(f"connection lost: {e}") from e
            if not data:
                self._shut()
                raise STMPConnectionClosed("the broker closed the connection")
            self._handle_bytes(data)
            return True

    def _handle_bytes(self, data: bytes) -> None:
        self._last_heard = self._now()
        try:
            for message in self._wire.feed(data):
                self._handle(message)
        except RemoteProtocolError as e:
            self._shut()
            raise STMPConnectionClosed(f"protocol error from the broker: {e}") from e
        if isinstance(self._wire, _WebSocketWire) and self._wire.closed_by_server:
            self._shut()
            if self._waiting is None or self._reply is None:
                raise STMPConnectionClosed("the broker closed the connection")

    def _beat(self, now: float) -> float | None:
        """Ping or give up as due; when to check again (None: no heartbeat)."""
        interval = self.heartbeat
        if not interval:
            return None
        if now - self._last_heard >= 2 * interval:
            self._shut()
            raise STMPConnectionClosed(f"nothing from the broker for {2 * interval:g} s")
        if now - self._last_ping >= interval:
            self.ping()
        return min(self._last_ping + interval, self._last_heard + 2 * interval)

    def _handle(self, message: Message) -> None:
        kind = type(message)
        if kind is Response:
            assert isinstance(message, Response)
            if message.id == self._waiting and self._reply is None:
                self._reply = message
            elif self._late.claim(message.id):
                self.late_replies += 1
            # else: a reply to nothing we asked; ignored
        elif kind is Notify:
            assert isinstance(message, Notify)
            if message.action == payloads.DELIVERY:
                with contextlib.suppress(ValueError):  # a malformed delivery is dropped
                    self._deliveries.append(delivery_of(message))
            else:
                self._notifies.append(message)
        elif kind is Ping:
            self.pings_received += 1
        elif kind is Request:
            assert isinstance(message, Request)
            self._send(Response(message.id, Status.NOT_FOUND))

    def _shut(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
