"""The blocking STMP client — over TCP (binary serialization) or WebSocket (text
serialization, on the client kit's small RFC 6455 client on a plain socket: no reactor, no
extra dependency): :class:`~.client_session.STMPClientSession` on the client kit's
:class:`~msgbroker.clientkit.blocking.BlockingClient`. :mod:`msgbroker.plugins.stmp.client`
re-exports it with the values and errors; import from there.
"""

from __future__ import annotations

import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp
from msgbroker.clientkit.websocket import WebSocketChannel

from . import codec
from .client_common import (
    DEFAULT_PORT,
    DEFAULT_WS_PORT,
    HEARTBEAT,
    REQUEST_TIMEOUT,
    Delivery,
    STMPConnectionClosed,
    STMPError,
    decoded,
    status_name,
)
from .client_session import BinaryWire, STMPClientSession, WebSocketWire
from .codec import Encoding, Notify, Response

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_WS_PORT",
    "HEARTBEAT",
    "REQUEST_TIMEOUT",
    "BlockingSTMPClient",
    "Delivery",
    "STMPConnectionClosed",
    "STMPError",
    "decoded",
    "status_name",
]


class BlockingSTMPClient(BlockingClient):
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

    peer = "broker"
    session: STMPClientSession

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
        port = port if port is not None else (DEFAULT_WS_PORT if ws else DEFAULT_PORT)
        self._deliveries: deque[Delivery] = deque()
        self._notifies: deque[Notify] = deque()
        wire = WebSocketWire(max_payload, binary_frames) if ws else BinaryWire(max_payload)
        session = STMPClientSession(wire, encoding=encoding, timeout=timeout, heartbeat=heartbeat)
        deadline = clock() + timeout
        sock = open_tcp(
            host, port, timeout=timeout, ssl_context=ssl_context, server_hostname=server_hostname
        )
        channel: StreamChannel
        try:
            if ws:
                channel = WebSocketChannel(
                    sock, host, port, path, max_message=max_payload + 64, deadline=deadline,
                    closed_error=STMPConnectionClosed, clock=clock,
                )  # fmt: skip
            else:
                channel = StreamChannel(sock)
        except BaseException:
            sock.close()
            raise
        super().__init__(session, channel, timeout=timeout, clock=clock)
        try:
            self._read_until(lambda: session.ready)
            if identity is not None:
                self.login(identity, scheme, credential)
        except BaseException:
            self._shut()
            raise

    @property
    def identity(self) -> str | None:
        return self.session.identity

    @property
    def stmp_version(self) -> tuple[int, int] | None:
        return self.session.stmp_version

    @property
    def pings_received(self) -> int:
        return self.session.pings_received

    @property
    def late_replies(self) -> int:
        """Late replies dropped (their request had timed out)."""
        return self.session.late_replies

    @property
    def encoding(self) -> int:
        return self.session.encoding

    @property
    def heartbeat(self) -> float | None:
        return self.session.heartbeat

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
        response: Response = self._wait(
            self.session.request(action, payload, encoding, timeout, now=self._now())
        )
        return response

    def call(
        self,
        action: int | str,
        payload: Any = None,
        encoding: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """:meth:`request`, then the decoded reply payload (``None`` if none);
        :class:`STMPError` unless the status is Ok (``local`` set for a timeout)."""
        return self._wait(self.session.call(action, payload, encoding, timeout, now=self._now()))

    def login(
        self, identity: str, scheme: str = "open", credential: bytes | str | None = None
    ) -> None:
        self._wait(self.session.login(identity, scheme, credential, now=self._now()))

    def subscribe(self, topic: str, presence: bool = False) -> None:
        self._wait(self.session.subscribe(topic, presence, now=self._now()))

    def unsubscribe(self, topic: str) -> None:
        self._wait(self.session.unsubscribe(topic, now=self._now()))

    def publish(self, topic: str, data: bytes) -> None:
        self._wait(self.session.publish(topic, data, now=self._now()))

    def unicast(self, to: str, data: bytes) -> None:
        self._wait(self.session.unicast(to, data, now=self._now()))

    def broadcast(self, data: bytes) -> None:
        self._wait(self.session.broadcast(data, now=self._now()))

    def notify(self, action: int | str, payload: Any = None, encoding: int | None = None) -> None:
        """Send a notify (no reply)."""
        self.session.notify(action, payload, encoding)
        self._sent()

    def ping(self) -> None:
        """Send a heartbeat ping now (the server does not answer it)."""
        self.session.ping(self._now())
        self._sent()

    def close(self) -> None:
        """Close the connection (over WebSocket with the closing handshake, waiting up to 2 s
        for the server's close). Never raises; does nothing when already closed."""
        super().close()

    # -- incoming ----------------------------------------------------------------------------

    def next_delivery(self, timeout: float | None = None) -> Delivery | None:
        """The next delivery (queued or read now), or ``None`` after ``timeout`` seconds
        (``None``: wait as long as it takes; ``0``: only what has already arrived). Raises
        :class:`STMPConnectionClosed` if the connection ends."""
        delivery: Delivery | None = self._next(self._deliveries, timeout)
        return delivery

    def next_notify(self, timeout: float | None = None) -> Notify | None:
        """The next notify that is not a delivery (a plugin's), like :meth:`next_delivery`."""
        notify: Notify | None = self._next(self._notifies, timeout)
        return notify

    def deliveries(self) -> Iterator[Delivery]:
        """Every delivery, as it arrives, until the connection ends (which raises)."""
        while True:
            delivery = self.next_delivery()
            if delivery is not None:
                yield delivery

    def _event(self, event: Any) -> None:
        if isinstance(event, Delivery):
            self._deliveries.append(event)
        elif isinstance(event, Notify):
            self._notifies.append(event)
        # Ready is in session.ready; a malformed delivery is dropped
