"""The blocking SSMP client, over a plain or ``ssl``-wrapped socket (no reactor involved):
:class:`~.client_session.SSMPClientSession` on the client kit's
:class:`~msgbroker.clientkit.blocking.BlockingClient`.
:mod:`msgbroker.plugins.ssmp.client` re-exports it with the errors; import from there.
"""

from __future__ import annotations

import contextlib
import ssl
from collections import deque
from collections.abc import Callable, Iterator

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp
from msgbroker.clientkit.reconnect import Reconnect

from .client_session import DEFAULT_PORT, KEEPALIVE, SSMPClientSession, SSMPError, SSMPRequests
from .codec import Delivery, Presence

__all__ = ["BlockingSSMPClient"]


class BlockingSSMPClient(SSMPRequests, BlockingClient):
    """A blocking SSMP client over a plain (or ``ssl``-wrapped) socket, logged in on
    construction. Not thread-safe.

    Request methods return once the broker answered ``200`` and raise :class:`SSMPError`
    otherwise. Events that arrive meanwhile are queued for :meth:`next_event`. A request
    unanswered after ``timeout`` seconds raises ``TimeoutError`` and closes the connection
    (a late reply would otherwise be taken for the next request's). The server's ``PING``
    is answered, and the keepalive ``PING`` sent, whenever the client reads.

    ``reconnect`` (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`): a lost
    connection is opened again, logged in and subscribed again, by the next call (see
    :mod:`msgbroker.clientkit.blocking`).
    """

    peer = "broker"
    session: SSMPClientSession

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        identity: str = ".",
        scheme: str = "open",
        credential: bytes | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 10.0,
        keepalive: float | None = KEEPALIVE,
        reconnect: Reconnect | bool | None = None,
    ) -> None:
        self.identity = identity
        self._events: deque[Delivery | Presence] = deque()
        self._address = host, port, ssl_context, server_hostname
        self.timeout = timeout
        session, channel = self._connect(keepalive)
        super().__init__(session, channel, timeout=timeout, reconnect=reconnect)
        try:
            self._perform(lambda: self.session.login(identity, scheme, credential))
        except BaseException:
            self._shut()
            raise
        self._opened()

    def _connect(self, keepalive: float | None) -> tuple[SSMPClientSession, StreamChannel]:
        host, port, context, server_hostname = self._address
        sock = open_tcp(
            host, port, timeout=self.timeout, ssl_context=context, server_hostname=server_hostname
        )
        return SSMPClientSession(keepalive), StreamChannel(sock)

    def _reopen(self) -> tuple[SSMPClientSession, StreamChannel]:
        return self._connect(self.session.keepalive)

    # -- requests (subscribe, unsubscribe, mcast, ucast, bcast: SSMPRequests') -----------------

    def ping(self) -> None:
        """Send ``PING`` and wait for the ``PONG`` event."""
        # the session asked at the time: after a reconnection it is another one
        self._ask(lambda: self.session.ping(), self.timeout, "PONG")  # noqa: PLW0108

    def close(self) -> None:
        """Send ``CLOSE``, wait (up to ``timeout``) for the ``200``, close the socket.
        Never raises; does nothing when already closed."""
        super().close()

    # -- events ------------------------------------------------------------------------------

    def next_event(self, timeout: float | None = None) -> Delivery | Presence | None:
        """The next event (queued or read now), or ``None`` after ``timeout`` seconds
        (``None``: wait as long as it takes; ``0``: only what has already arrived). Raises
        :class:`SSMPConnectionClosed` if the connection ends."""
        event: Delivery | Presence | None = self._next(self._events, timeout)
        return event

    def events(self) -> Iterator[Delivery | Presence]:
        """Every event, as it arrives, until the connection ends."""
        return self._every(self.next_event)

    # -- plumbing ----------------------------------------------------------------------------

    def _perform(self, ask: Callable[[], int]) -> None:
        self._ask(ask, self.timeout)

    def _event(self, event: Delivery | Presence) -> None:
        self._events.append(event)

    def _goodbye(self) -> None:
        with contextlib.suppress(SSMPError):
            self._perform(self.session.request_close)
