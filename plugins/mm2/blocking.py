"""The blocking Micromessage2 client, on a plain socket: no reactor, no Twisted. It drives
the sans-IO :class:`~.client_session.ClientSession` on the client kit's
:class:`~msgbroker.clientkit.blocking.BlockingClient`, as the Twisted client does on the
kit's Twisted driver; :mod:`msgbroker.plugins.mm2.client` re-exports it with the errors and
:class:`Message`.
"""

from __future__ import annotations

import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp
from msgbroker.clientkit.reconnect import Reconnect

from . import client_common as common
from .client_common import ExtensionReceived, ExtensionSpec, Message
from .client_session import ClientSession


class BlockingMM2Client(common.MM2Commands, BlockingClient):
    """A blocking Micromessage2 client over TCP, plain or TLS (``ssl_context``). The
    handshake runs on construction: :class:`~.client_common.MM2HandshakeRefused`,
    :class:`~.client_common.MM2ServerError` or :class:`common.MM2Timeout` when it fails. Not
    thread-safe.

    ``identity``, ``required``, ``optional``, ``supported`` and ``accept_suggested`` are
    :class:`~.client_session.ClientSession`'s. :meth:`publish` blocks while the ack window
    is full, reading the server's acks, up to ``timeout`` seconds (then
    :class:`common.MM2Timeout`, and the message is not sent). Messages that arrive meanwhile are
    queued for :meth:`next_message`; with an ack extension active, a message handed out by
    :meth:`next_message` counts as handled (``auto_ack=False``: when passed to :meth:`ack`),
    and one cumulative ack goes out when nothing more is queued or a window's worth is
    handled. ``clock`` is where timeouts read the time (``time.monotonic``; tests pass a
    fake). Micromessage2 has no heartbeat: a client may stay silent as long as it likes.

    ``reconnect`` (True, or a :class:`~msgbroker.clientkit.reconnect.Reconnect`): a lost
    connection is opened again (the handshake) and subscribed again by the next call (see
    :mod:`msgbroker.clientkit.blocking`); ``sleep`` waits between attempts. Messages
    received before are still handed out, but have no ack to give any more.
    """

    session: ClientSession
    timeout: float

    def __init__(
        self,
        host: str,
        port: int | None = None,
        identity: str = "",
        required: Iterable[ExtensionSpec] = common.DEFAULT_REQUIRED,
        optional: Iterable[ExtensionSpec] = common.DEFAULT_OPTIONAL,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = common.TIMEOUT,
        auto_ack: bool = True,
        clock: Callable[[], float] = time.monotonic,
        reconnect: Reconnect | bool | None = None,
        sleep: Callable[[float], object] = time.sleep,
        **session_options: Any,
    ) -> None:
        self.auto_ack = auto_ack
        # each message with the session it came on (only that one can acknowledge it)
        self._messages: deque[tuple[Message, ClientSession]] = deque()
        self._handed: list[Message] = []  # handed out, to ack (auto_ack=False)
        self._extensions: deque[ExtensionReceived] = deque()
        port = common.DEFAULT_PORT if port is None else port
        self._address = host, port, ssl_context, server_hostname
        self._session_args = (identity, required, optional), {"timeout": timeout, **session_options}
        self.timeout = timeout
        session, channel = self._reopen()
        super().__init__(
            session, channel, timeout=timeout, clock=clock, reconnect=reconnect, sleep=sleep
        )
        try:
            self._opening()
        except BaseException:
            self._shut()
            raise
        self._opened()

    def _reopen(self) -> tuple[ClientSession, StreamChannel]:
        host, port, ssl_context, server_hostname = self._address
        args, options = self._session_args
        session = ClientSession(*args, **options)
        sock = open_tcp(
            host, port, timeout=self.timeout, ssl_context=ssl_context,
            server_hostname=server_hostname,
        )  # fmt: skip
        return session, StreamChannel(sock)

    def _opening(self) -> None:
        """The handshake (the session times it out)."""
        self._handed.clear()
        self._read_until(lambda: self.session.ready)

    # -- sending -----------------------------------------------------------------------------

    def _publish(self, message: tuple[Any, ...], timeout: float | None) -> int:
        """Once the window has room (reading the server's acks); its seq.
        :class:`common.MM2Timeout` when no room came within ``timeout``: nothing is sent."""
        wait = self.timeout if timeout is None else timeout
        self._usable(wait)
        prepared = self.session.prepare(*message)
        if not self._read_until(lambda: self.session.has_room, self._now() + wait):
            raise common.MM2Timeout(f"no room in the ack window within {wait:g} s")
        seq = self.session.send(prepared)
        self._sent()
        return seq

    def _command(self, write: Callable[[], object]) -> None:
        self._usable()
        write()
        self._sent()

    def wait_acked(self, timeout: float | None = None) -> bool:
        """Read until the server acknowledged every published message; False after
        ``timeout`` seconds (default: the client's) without that."""
        deadline = self._now() + (self.timeout if timeout is None else timeout)
        return self._read_until(lambda: not self.session.unacked, deadline)

    # -- receiving ---------------------------------------------------------------------------

    def next_message(self, timeout: float | None = None) -> Message | None:
        """The next message (queued or read now), or None after ``timeout`` seconds (None:
        as long as it takes; 0: only what was already read). Raises
        :class:`MM2ConnectionClosed` (or the server's :class:`MM2ServerError`) when the
        connection ends and nothing is queued."""
        item: tuple[Message, ClientSession] | None = self._next(self._messages, timeout)
        if item is None:
            return None
        message, session = item
        if session is not self.session or self.closed:
            return message  # it came before a reconnection: no ack to give
        if not self.auto_ack:
            if self.session.window is not None:  # an ack extension: it is owed an ack
                self._handed.append(message)
        else:
            self.session.done(message.seq)
            handled, window = self.session.handled, self.session.window or 1
            if not self._messages or handled >= window:
                self._send_acks()
        return message

    def messages(self) -> Iterator[Message]:
        """Every message, as it arrives, until the connection ends (which raises)."""
        return self._every(self.next_message)

    def ack(self, message: Message) -> None:
        """With ``auto_ack=False``: ``message`` is handled; acknowledge it (and the earlier
        handled ones) now. A message received before a reconnection has no ack to give."""
        for i, handed in enumerate(self._handed):
            if handed is message:
                del self._handed[i]
                self.session.done(message.seq)
                self._send_acks()
                return

    def next_extension(self, timeout: float | None = None) -> ExtensionReceived | None:
        """The next EXTENSION frame of an active extension the client gives no meaning
        itself (a vendor one), like :meth:`next_message`."""
        extension: ExtensionReceived | None = self._next(self._extensions, timeout)
        return extension

    # -- plumbing ----------------------------------------------------------------------------

    def _send_acks(self) -> None:
        if not self.closed and self.session.flush_acks() is not None:
            self._sent()

    def _event(self, event: Any) -> None:
        if isinstance(event, Message):
            self._messages.append((event, self.session))
        elif isinstance(event, ExtensionReceived):
            self._extensions.append(event)
