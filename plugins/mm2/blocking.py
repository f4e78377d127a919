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
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp

from .client_common import (
    DEFAULT_OPTIONAL,
    DEFAULT_PORT,
    DEFAULT_REQUIRED,
    TIMEOUT,
    ExtensionSpec,
    Message,
    MM2Timeout,
)
from .client_session import ClientSession, ExtensionReceived
from .codec import (
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MAX_PAYLOAD,
    FRAGMENT_SIZE,
    ActiveExtensions,
    Command,
    Filter,
    PropertyValue,
)


class BlockingMM2Client(BlockingClient):
    """A blocking Micromessage2 client over TCP, plain or TLS (``ssl_context``). The
    handshake runs on construction: :class:`~.client_common.MM2HandshakeRefused`,
    :class:`~.client_common.MM2ServerError` or :class:`MM2Timeout` when it fails. Not
    thread-safe.

    ``identity``, ``required``, ``optional``, ``supported`` and ``accept_suggested`` are
    :class:`~.client_session.ClientSession`'s. :meth:`publish` blocks while the ack window
    is full, reading the server's acks, up to ``timeout`` seconds (then
    :class:`MM2Timeout`, and the message is not sent). Messages that arrive meanwhile are
    queued for :meth:`next_message`; with an ack extension active, a message handed out by
    :meth:`next_message` counts as handled (``auto_ack=False``: when passed to :meth:`ack`),
    and one cumulative ack goes out when nothing more is queued or a window's worth is
    handled. ``clock`` is where timeouts read the time (``time.monotonic``; tests pass a
    fake). Micromessage2 has no heartbeat: a client may stay silent as long as it likes.
    """

    session: ClientSession
    timeout: float

    def __init__(
        self,
        host: str,
        port: int | None = None,
        identity: str = "",
        required: Iterable[ExtensionSpec] = DEFAULT_REQUIRED,
        optional: Iterable[ExtensionSpec] = DEFAULT_OPTIONAL,
        *,
        supported: Iterable[str] = (),
        accept_suggested: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = TIMEOUT,
        auto_ack: bool = True,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_message: int = DEFAULT_MAX_MESSAGE,
        fragment_size: int = FRAGMENT_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auto_ack = auto_ack
        self._messages: deque[Message] = deque()
        self._extensions: deque[ExtensionReceived] = deque()
        session = ClientSession(
            identity, required, optional, supported=supported,
            accept_suggested=accept_suggested, max_payload=max_payload,
            max_message=max_message, fragment_size=fragment_size, timeout=timeout,
        )  # fmt: skip
        sock = open_tcp(
            host, DEFAULT_PORT if port is None else port, timeout=timeout,
            ssl_context=ssl_context, server_hostname=server_hostname,
        )  # fmt: skip
        super().__init__(session, StreamChannel(sock), timeout=timeout, clock=clock)
        try:
            self._read_until(lambda: session.ready)  # the session times the handshake out
        except BaseException:
            self._shut()
            raise

    @property
    def active(self) -> ActiveExtensions:
        return self.session.active

    @property
    def unacked(self) -> int:
        """Published messages the server has not acknowledged yet."""
        return self.session.unacked

    # -- sending -----------------------------------------------------------------------------

    def publish(
        self,
        destination: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        *,
        type_name: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Send a MESSAGE once the window has room; its seq. ``payload`` is bytes, or with
        ``json`` active any JSON value; ``type_name`` needs ``dotnet``. ValueError or
        TypeError for what cannot be sent; :class:`MM2Timeout` when no room came within
        ``timeout`` seconds (default: the client's)."""
        self._check_open()
        message = self.session.prepare(destination, payload, properties, type_name)
        wait = self.timeout if timeout is None else timeout
        if not self._read_until(lambda: self.session.has_room, self._now() + wait):
            raise MM2Timeout(f"no room in the ack window within {wait:g} s")
        seq = self.session.send(message)
        self._sent()
        return seq

    def unicast(
        self,
        identity: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        **kw: Any,
    ) -> int:
        """:meth:`publish` to ``@identity``."""
        return self.publish(f"@{identity}", payload, properties, **kw)

    def subscribe(
        self, destination: str, queue: str | None = None, filters: Iterable[Filter | str] = ()
    ) -> None:
        """Write a ``subscribe`` command; filters are :class:`Filter` values or their text
        (``"price>=N10"``). No reply comes: it takes effect before any later frame."""
        self._check_open()
        self.session.subscribe(destination, queue, filters)
        self._sent()

    def unsubscribe(self, destination: str) -> None:
        self._check_open()
        self.session.unsubscribe(destination)
        self._sent()

    def command(self, command: Command) -> None:
        """Write any COMMAND frame."""
        self._check_open()
        self.session.command(command)
        self._sent()

    def send_extension(self, name: str, payload: bytes) -> None:
        """Write an EXTENSION frame of the active extension ``name``."""
        self._check_open()
        self.session.send_extension(name, payload)
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
        message: Message | None = self._next(self._messages, timeout)
        if message is not None and self.auto_ack:
            self.session.done(message.seq)
            handled, window = self.session.handled, self.session.window or 1
            if not self._messages or handled >= window:
                self._send_acks()
        return message

    def messages(self) -> Iterator[Message]:
        """Every message, as it arrives, until the connection ends (which raises)."""
        while True:
            message = self.next_message()
            if message is not None:
                yield message

    def ack(self, message: Message) -> None:
        """With ``auto_ack=False``: ``message`` is handled; acknowledge it (and the earlier
        handled ones) now."""
        self.session.done(message.seq)
        self._send_acks()

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
            self._messages.append(event)
        elif isinstance(event, ExtensionReceived):
            self._extensions.append(event)
