"""The SSMP client connection, sans-IO (:class:`SSMPClientSession`), and the errors both
SSMP clients raise. The Twisted client (:mod:`.client`) and the blocking client
(:mod:`.blocking`) drive it through :mod:`msgbroker.clientkit`; import from
:mod:`msgbroker.plugins.ssmp.client`.

What it does: each request writes its line and returns a token; replies answer requests
first in, first out (a reply other than ``200`` is an :class:`SSMPError`); the server's
``PING`` is answered with ``PONG``; after ``keepalive`` seconds without hearing from the
server it sends its own ``PING`` and ends the session when no ``PONG`` follows within
``keepalive`` seconds more. Anything from the server outside the grammar (an event with an
unknown verb included) ends it with the codec's :class:`RemoteProtocolError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from msgbroker.clientkit.reconnect import Replay
from msgbroker.clientkit.session import ClientSession, ConnectionClosed, SessionAttribute
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


class SSMPConnectionClosed(ConnectionClosed):
    """The connection ended (or was never usable) before the request was answered."""


class SSMPClientSession(ClientSession):
    """One SSMP client connection's state (see the module docstring). Events:
    :class:`~.codec.Delivery` and :class:`~.codec.Presence`; requests are answered with
    None on ``200``."""

    closed_error = SSMPConnectionClosed

    def __init__(self, keepalive: float | None = KEEPALIVE) -> None:
        super().__init__()
        #: seconds of silence before the keepalive PING (None: no keepalive)
        self.keepalive = keepalive
        #: the identity logged in as, once the broker accepted the login
        self.identity: str | None = None
        #: how many server PINGs were answered with PONG, and how many PINGs were sent
        self.pings_answered = 0
        self.pings_sent = 0
        #: when the keepalive PING went out, while its PONG is awaited
        self.pinged_at: float | None = None
        self._decoder = codec.ReplyDecoder()
        # (token, what a 200 does to the restorable state)
        self._replies: deque[tuple[int, Callable[[], object] | None]] = deque()
        self._login: tuple[str, str, bytes | None] | None = None
        self._subscriptions: dict[str, bool] = {}  # topic: presence, in the order made
        self._pongs: deque[int | None] = deque()  # tokens of PINGs (None: the keepalive's)
        self._closing = False
        self._last_heard = 0.0
        self._due: float | None = None

    @property
    def closing(self) -> bool:
        """Whether ``CLOSE`` was sent (no request may follow it)."""
        return self._closing

    # -- requests (each returns its token; ValueError for what SSMP cannot carry) -------------

    def login(self, identity: str, scheme: str = "open", credential: bytes | None = None) -> int:
        def logged_in() -> None:
            self.identity = identity
            self._login = identity, scheme, credential

        return self._request(codec.login(identity, scheme, credential), logged_in)

    def subscribe(self, topic: str, presence: bool = False) -> int:
        def subscribed() -> None:
            self._subscriptions.pop(topic, None)
            self._subscriptions[topic] = presence

        return self._request(codec.subscribe(topic, presence), subscribed)

    def unsubscribe(self, topic: str) -> int:
        return self._request(
            codec.unsubscribe(topic), lambda: self._subscriptions.pop(topic, None)
        )

    def mcast(self, topic: str, payload: bytes) -> int:
        return self._request(codec.mcast(topic, payload))

    def ucast(self, target: str, payload: bytes) -> int:
        return self._request(codec.ucast(target, payload))

    def bcast(self, payload: bytes) -> int:
        return self._request(codec.bcast(payload))

    def ping(self) -> int:
        """``PING``; answered when the matching ``PONG`` event arrives."""
        self._check_requests()
        token = self._token()
        self._pongs.append(token)
        self._ping()
        return token

    def request_close(self) -> int:
        """``CLOSE``; nothing may be asked after it."""
        token = self._request(codec.close())
        self._closing = True
        return token

    def _request(self, frame: bytes, accepted: Callable[[], object] | None = None) -> int:
        self._check_requests()
        token = self._token()
        self._replies.append((token, accepted))
        self._send(frame)
        return token

    def replay(self) -> list[Replay]:
        """The login the broker accepted, then the topics subscribed to (with
        ``presence`` as asked)."""
        items = []
        if self._login is not None:
            login = self._login
            items.append(Replay(f"login {login[0]}", lambda s, now: s.login(*login), login=True))
        for topic, presence in self._subscriptions.items():
            items.append(Replay(f"subscribe {topic}", _subscribe(topic, presence)))
        return items

    def _check_requests(self) -> None:
        if self._closing or self.ended:
            raise SSMPConnectionClosed("the connection is closed")

    def _ping(self) -> None:
        self.pings_sent += 1
        self._send(codec.ping())

    # -- the session -------------------------------------------------------------------------

    def _started(self, now: float) -> None:
        self._last_heard = now
        if self.keepalive:
            self._due = now + self.keepalive

    def next_tick(self) -> float | None:
        return self._due

    def _tick(self, now: float) -> None:
        """Ping after ``keepalive`` s without hearing from the server; give up when the
        ``PONG`` has not come ``keepalive`` s later."""
        interval = self.keepalive
        if not interval or self._due is None or now < self._due:
            return
        if self.pinged_at is not None:
            if now - self.pinged_at >= interval:
                self._due = None
                self._end(SSMPConnectionClosed(f"no PONG within {interval:g} s"))
                return
            self._due = self.pinged_at + interval
        elif now - self._last_heard >= interval:
            self.pinged_at = now
            self._pongs.append(None)
            self._ping()
            self._due = now + interval
        else:
            self._due = self._last_heard + interval

    def _received(self, data: bytes, now: float) -> None:
        self._last_heard = now
        for message in self._decoder.feed(data):
            self._message(message)

    def _message(self, message: codec.ServerMessage) -> None:
        if isinstance(message, Delivery | Presence):
            self._emit(message)
        elif isinstance(message, codec.Reply):
            if not self._replies:
                raise RemoteProtocolError(f"reply {message.code} to no request")
            token, accepted = self._replies.popleft()
            if message.code != 200:
                self._fail(token, SSMPError(message.code, message.payload))
                return
            if accepted is not None:
                accepted()
            self._answer(token)
        elif isinstance(message, codec.ServerPing):
            self.pings_answered += 1
            self._send(codec.pong())
        else:  # ServerPong
            self.pinged_at = None
            if self._pongs:
                waiter = self._pongs.popleft()
                if waiter is not None:
                    self._answer(waiter)


def _subscribe(topic: str, presence: bool) -> Callable[[SSMPClientSession, float], int]:
    return lambda session, now: session.subscribe(topic, presence)


class SSMPRequests:
    r"""The SSMP requests, once for both clients: each asks :attr:`session` and
    :meth:`_perform`\ s it — the Twisted client returns a Deferred that fires with None on
    ``200`` (fails with :class:`SSMPError` otherwise), the blocking client waits and returns
    None (raises). Invalid ids or payloads raise ``ValueError`` at once."""

    session: SSMPClientSession

    def _perform(self, ask: Callable[[], int]) -> Any:
        raise NotImplementedError

    keepalive = SessionAttribute("seconds of silence before the keepalive PING")
    pings_answered = SessionAttribute("how many server PINGs this client answered with PONG")
    pings_sent = SessionAttribute("how many PINGs this client sent (its own, the keepalive's)")

    def subscribe(self, topic: str, presence: bool = False) -> Any:
        return self._perform(lambda: self.session.subscribe(topic, presence))

    def unsubscribe(self, topic: str) -> Any:
        return self._perform(lambda: self.session.unsubscribe(topic))

    def mcast(self, topic: str, payload: bytes) -> Any:
        return self._perform(lambda: self.session.mcast(topic, payload))

    def ucast(self, target: str, payload: bytes) -> Any:
        return self._perform(lambda: self.session.ucast(target, payload))

    def bcast(self, payload: bytes) -> Any:
        return self._perform(lambda: self.session.bcast(payload))
