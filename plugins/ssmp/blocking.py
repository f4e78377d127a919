"""The blocking SSMP client, over a plain or ``ssl``-wrapped socket (no reactor involved),
and the errors both SSMP clients raise. :mod:`msgbroker.plugins.ssmp.client` re-exports
everything here; import from there.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from collections.abc import Iterator

from msgbroker.errors import RemoteProtocolError

from . import codec
from .codec import Delivery, Presence

DEFAULT_PORT = 4444
KEEPALIVE = 30.0

REASONS = {
    400: "bad request",
    401: "unauthorized",
    404: "not found",
    405: "not allowed",
    409: "already subscribed",
    501: "not implemented",
}


class SSMPError(Exception):
    """The broker answered a request with ``code`` (not 200) and an optional payload (for
    ``401``: the space-separated list of the schemes it offers)."""

    def __init__(self, code: int, payload: bytes | None = None) -> None:
        super().__init__(code, payload)
        self.code = code
        self.payload = payload

    def __str__(self) -> str:
        text = f"{self.code} {REASONS.get(self.code, 'error')}"
        if self.payload:
            text += ": " + self.payload.decode("utf-8", "backslashreplace")
        return text


class SSMPConnectionClosed(ConnectionError):
    """The connection ended (or was never usable) before the request was answered."""


class BlockingSSMPClient:
    """A blocking SSMP client over a plain (or ``ssl``-wrapped) socket, logged in on
    construction. Not thread-safe.

    Request methods return once the broker answered ``200`` and raise :class:`SSMPError`
    otherwise. Events that arrive meanwhile are queued for :meth:`next_event`. A request
    unanswered after ``timeout`` seconds raises ``TimeoutError`` and closes the connection
    (a late reply would otherwise be taken for the next request's). The server's ``PING``
    is answered whenever the client reads.
    """

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
    ) -> None:
        self.identity = identity
        self.timeout = timeout
        self.keepalive = keepalive
        self.closed = False
        #: how many server PINGs this client answered with PONG
        self.pings_answered = 0
        self._decoder = codec.ReplyDecoder()
        self._events: deque[Delivery | Presence] = deque()
        self._replies: deque[codec.Reply] = deque()
        self._waiting = 0
        self._pongs_sent = 0
        self._pongs_received = 0
        self._pinged_at: float | None = None
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._last_heard = time.monotonic()
        try:
            self._call(codec.login(identity, scheme, credential))
        except BaseException:
            self._shut()
            raise

    def __enter__(self) -> BlockingSSMPClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def subscribe(self, topic: str, presence: bool = False) -> None:
        self._call(codec.subscribe(topic, presence))

    def unsubscribe(self, topic: str) -> None:
        self._call(codec.unsubscribe(topic))

    def mcast(self, topic: str, payload: bytes) -> None:
        self._call(codec.mcast(topic, payload))

    def ucast(self, target: str, payload: bytes) -> None:
        self._call(codec.ucast(target, payload))

    def bcast(self, payload: bytes) -> None:
        self._call(codec.bcast(payload))

    def ping(self) -> None:
        """Send ``PING`` and wait for the ``PONG`` event."""
        self._send(codec.ping())
        self._pongs_sent += 1
        target = self._pongs_sent
        deadline = time.monotonic() + self.timeout
        while self._pongs_received < target:
            if not self._receive(deadline):
                self._shut()
                raise TimeoutError(f"no PONG within {self.timeout:g} s")

    def close(self) -> None:
        """Send ``CLOSE``, wait (up to ``timeout``) for the ``200``, close the socket.
        Never raises; does nothing when already closed."""
        if self.closed:
            return
        try:
            self._call(codec.close())
        except (OSError, SSMPError, RemoteProtocolError):
            pass
        finally:
            self._shut()

    # -- events ------------------------------------------------------------------------------

    def next_event(self, timeout: float | None = None) -> Delivery | Presence | None:
        """The next event (queued or read now), or ``None`` after ``timeout`` seconds
        (``None``: wait as long as it takes; ``0``: only events already read). Raises
        :class:`SSMPConnectionClosed` if the connection ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._events:
            if not self._receive(deadline):
                return None
        return self._events.popleft()

    def events(self) -> Iterator[Delivery | Presence]:
        """Every event, as it arrives, until the connection ends."""
        while True:
            event = self.next_event()
            if event is not None:
                yield event

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, frame: bytes) -> None:
        self._send(frame)
        self._waiting += 1
        deadline = time.monotonic() + self.timeout
        while not self._replies:
            if not self._receive(deadline):
                self._shut()
                raise TimeoutError(f"no reply within {self.timeout:g} s")
        reply = self._replies.popleft()
        if reply.code != 200:
            raise SSMPError(reply.code, reply.payload)

    def _send(self, frame: bytes) -> None:
        if self.closed:
            raise SSMPConnectionClosed("the connection is closed")
        try:
            self._sock.sendall(frame)
        except OSError as e:
            self._shut()
            raise SSMPConnectionClosed(f"cannot send: {e}") from e

    def _receive(self, deadline: float | None) -> bool:
        """Read and handle one chunk; False if ``deadline`` passed first. Sends the
        keepalive ``PING`` when due."""
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if self.closed:
                raise SSMPConnectionClosed("the connection is closed")
            wakes = [t for t in (self._keepalive(now), deadline) if t is not None]
            self._sock.settimeout(max(min(wakes) - now, 0.001) if wakes else None)
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as e:
                self._shut()
                raise SSMPConnectionClosed(f"connection lost: {e}") from e
            if not data:
                self._shut()
                raise SSMPConnectionClosed("the broker closed the connection")
            self._last_heard = time.monotonic()
            try:
                for message in self._decoder.feed(data):
                    self._handle(message)
            except RemoteProtocolError as e:
                self._shut()
                raise SSMPConnectionClosed(f"protocol error from the broker: {e}") from e
            return True

    def _keepalive(self, now: float) -> float | None:
        """Ping or give up as due; return when to check again (None: no keepalive)."""
        interval = self.keepalive
        if not interval or self.closed:
            return None
        if self._pinged_at is not None:
            if now - self._pinged_at >= interval:
                self._shut()
                raise SSMPConnectionClosed(f"no PONG within {interval:g} s")
            return self._pinged_at + interval
        if now - self._last_heard >= interval:
            self._send(codec.ping())
            self._pongs_sent += 1
            self._pinged_at = now
            return now + interval
        return self._last_heard + interval

    def _handle(self, message: codec.ServerMessage) -> None:
        if isinstance(message, codec.Reply):
            if not self._waiting:
                raise RemoteProtocolError(f"reply {message.code} to no request")
            self._waiting -= 1
            self._replies.append(message)
        elif isinstance(message, codec.ServerPing):
            self.pings_answered += 1
            self._send(codec.pong())
        elif isinstance(message, codec.ServerPong):
            self._pongs_received += 1
            self._pinged_at = None
        else:
            self._events.append(message)

    def _shut(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
