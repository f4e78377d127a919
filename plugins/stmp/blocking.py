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
from msgbroker.clientkit.reconnect import Reconnect
from msgbroker.clientkit.websocket import WebSocketChannel

from . import client_common as common
from . import codec
from .client_common import Delivery
from .client_session import STMPClientSession, STMPRequests
from .codec import Encoding, Notify

__all__ = ["BlockingSTMPClient"]


class BlockingSTMPClient(STMPRequests, BlockingClient):
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

    ``reconnect`` (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`): a lost
    connection is opened again (the version check), logged in and subscribed again by the
    next call (see :mod:`msgbroker.clientkit.blocking`); ``sleep`` waits between attempts.
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
        timeout: float = common.REQUEST_TIMEOUT,
        heartbeat: float | None = common.HEARTBEAT,
        max_payload: int = codec.DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], float] = time.monotonic,
        reconnect: Reconnect | bool | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if port is None:
            port = common.DEFAULT_WS_PORT if ws else common.DEFAULT_PORT
        self._deliveries: deque[Delivery] = deque()
        self._notifies: deque[Notify] = deque()
        self._address = host, port, ssl_context, server_hostname, ws, path
        self._settings = binary_frames, max_payload, encoding, timeout, heartbeat
        self._now = clock
        session, channel = self._reopen()
        super().__init__(
            session, channel, timeout=timeout, clock=clock, reconnect=reconnect, sleep=sleep
        )
        try:
            self._opening()
            if identity is not None:
                self.login(identity, scheme, credential)
        except BaseException:
            self._shut()
            raise
        self._opened()

    def _reopen(self) -> tuple[STMPClientSession, StreamChannel]:
        host, port, ssl_context, server_hostname, ws, path = self._address
        binary_frames, max_payload, encoding, timeout, heartbeat = self._settings
        wire: common.BinaryWire | common.WebSocketWire = common.BinaryWire(max_payload)
        if ws:
            wire = common.WebSocketWire(max_payload, binary_frames)
        session = STMPClientSession(wire, encoding=encoding, timeout=timeout, heartbeat=heartbeat)
        deadline = self._now() + timeout
        sock = open_tcp(
            host, port, timeout=timeout, ssl_context=ssl_context, server_hostname=server_hostname
        )
        channel: StreamChannel
        try:
            if ws:
                channel = WebSocketChannel(
                    sock, host, port, path, max_message=max_payload + 64, deadline=deadline,
                    closed_error=common.STMPConnectionClosed, clock=self._now,
                )  # fmt: skip
            else:
                channel = StreamChannel(sock)
        except BaseException:
            sock.close()
            raise
        return session, channel

    def _opening(self) -> None:
        """The version check (the session times it out)."""
        self._read_until(lambda: self.session.ready)

    # -- requests (STMPRequests': each waits for its answer and returns it) ----------------------

    def _perform(self, ask: Callable[[float], int]) -> Any:
        return self._ask(lambda: ask(self._now()))

    def _perform_write(self, write: Callable[[float], None]) -> None:
        self._usable()
        write(self._now())
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
        return self._every(self.next_delivery)

    def _event(self, event: Any) -> None:
        if isinstance(event, Delivery):
            self._deliveries.append(event)
        elif isinstance(event, Notify):
            self._notifies.append(event)
        # Ready is in session.ready; a malformed delivery is dropped
