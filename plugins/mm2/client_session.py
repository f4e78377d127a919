"""The Micromessage2 client connection, sans-IO: :class:`ClientSession` is the logic both
clients drive through :mod:`msgbroker.clientkit` (the Twisted protocol in :mod:`.client`,
the blocking client in :mod:`.blocking`). Bytes from the server go in through
:meth:`ClientSession.receive`, which returns events; what to write accumulates for
:meth:`ClientSession.data_to_send`. No Twisted, no sockets, no clock: time comes in as
``now``, and the one timer, the handshake's timeout, as :meth:`ClientSession.tick`.

What it does:

- the handshake: step 1 at once; on the server's step 2, an ERROR frame and
  :class:`Closed` (:class:`MM2HandshakeRefused`) for another major version or a required
  extension the client lacks, else step 3 (:func:`.client_common.plan_confirm`) and
  :class:`Ready`;
- sending: sequence numbers 1..65535 then 1; payloads over 1 MiB in CONTINUED fragments;
  the ``dotnet`` type frame before a MESSAGE whose type differs from the last one sent;
  the ``ack``/``batch-ack`` window (:attr:`ClientSession.has_room`), opened by the server's
  acks (:class:`Acked`);
- receiving: fragments reassembled into :class:`~.client_common.Message` values (decoded
  JSON with ``json``, the last ``dotnet`` type); the acks the client owes, which the driver
  releases with :meth:`~ClientSession.done` and :meth:`~ClientSession.flush_acks`;
- an ERROR frame from the server ends the session (:class:`Closed` with
  :class:`MM2ServerError`); so does anything the server gets wrong, after the client's own
  ERROR frame (:class:`MM2ProtocolError`), and a handshake unanswered within ``timeout``
  (:class:`MM2Timeout`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from attrs import evolve

from msgbroker.clientkit.reconnect import Replay
from msgbroker.clientkit.session import ClientSession as KitSession
from msgbroker.errors import RemoteProtocolError

from . import client_common as common
from .client_common import (
    BUILTIN_EXTENSIONS,
    DEFAULT_OPTIONAL,
    DEFAULT_REQUIRED,
    Acked,
    Event,
    ExtensionReceived,
    ExtensionSpec,
    Message,
    Outgoing,
    Ready,
    as_extensions,
    check_message,
    check_own,
    decode_json,
    message_payload,
    plan_confirm,
    subscription,
)
from .codec import (
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MAX_PAYLOAD,
    FRAGMENT_SIZE,
    ActiveExtensions,
    Command,
    ErrorFrame,
    Extension,
    ExtensionFrame,
    Filter,
    FrameDecoder,
    Handshake,
    HandshakeDecoder,
    MessageFrame,
    PropertyValue,
    Reassembler,
    Unsubscribe,
    UnsupportedExtensions,
    ack_frame,
    acked_count,
    active_extensions,
    batch_ack_max_count,
    encode_frame,
    encode_handshake,
    encode_pubsub,
    negotiate_minor,
    next_seq,
    parse_ack,
    split_message,
    unsupported_required,
)
from .handshake import LOGIN_EXTENSION

# -- the session ----------------------------------------------------------------------------


class ClientSession(KitSession):
    """One client connection's protocol state. ``required`` and ``optional`` are the step-1
    lists (names or :class:`Extension` values); ``supported`` names extensions the client
    accepts when the server requires them, beyond the built-in ones and its own lists;
    ``accept_suggested`` also activates the server's optional extensions that the client
    supports but did not offer; ``timeout`` (seconds from :meth:`start`; None: no bound)
    bounds the wait for the server's step 2. ``login`` is a login scheme and credential,
    ``("password", "s3cret")``: the hello requires ``x-login`` (a server without it refuses
    before any credential is sent) and the confirmation carries them
    (``x-login:scheme=password,credential=s3cret``); without it the broker logs the
    identity in with ``cert`` or ``open``. ValueError at once for lists or an identity the
    handshake cannot carry."""

    closed_error = common.MM2ConnectionClosed

    def __init__(
        self,
        identity: str,
        required: Iterable[ExtensionSpec] = DEFAULT_REQUIRED,
        optional: Iterable[ExtensionSpec] = DEFAULT_OPTIONAL,
        *,
        supported: Iterable[str] = (),
        accept_suggested: bool = False,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_message: int = DEFAULT_MAX_MESSAGE,
        fragment_size: int = FRAGMENT_SIZE,
        timeout: float | None = None,
        login: tuple[str, str | bytes | None] | None = None,
    ) -> None:
        super().__init__()
        required = as_extensions(required)
        self._login: Extension | None = None
        if login is not None:
            scheme, credential = login
            if isinstance(credential, bytes):
                credential = credential.decode("utf-8")
            properties = [("scheme", scheme)]
            if credential is not None:
                properties.append(("credential", credential))
            self._login = Extension(LOGIN_EXTENSION, tuple(properties))
            required = (*required, Extension(LOGIN_EXTENSION))
        self.hello = Handshake(identity, required, as_extensions(optional))
        both = {ext.name for ext in self.hello.required} & {e.name for e in self.hello.optional}
        if both:
            raise ValueError(f"both required and optional: {', '.join(sorted(both))}")
        check_own(self.hello.required + self.hello.optional)
        self._send(encode_handshake(self.hello))  # ValueError for a bad identity
        names = {ext.name for ext in self.hello.required + self.hello.optional}
        self.supported = frozenset(BUILTIN_EXTENSIONS | names | set(supported))
        self.accept_suggested = accept_suggested
        self.fragment_size = fragment_size
        self.timeout = timeout
        self._deadline: float | None = None
        self._ready = False
        #: the server's step 2, the client's step 3 and the negotiated minor, once ready
        self.server: Handshake | None = None
        self.confirm: Handshake | None = None
        self.minor: int | None = None
        self.active = ActiveExtensions()
        #: the sender's window (1 with ``ack``, max-count with ``batch-ack``; None: no acks)
        self.window: int | None = None
        self._handshake = HandshakeDecoder()
        self._frames = FrameDecoder(max_payload)
        self._reassembler = Reassembler(max_message)
        self._json = False
        self._dotnet: int | None = None
        self._ack_out: int | None = None  # the id the acks we send carry
        self._ack_in: frozenset[int] = frozenset()  # the ids the server's acks may carry
        self._seq = 0  # last seq sent (0: none yet)
        self._oldest = 1  # the oldest unacknowledged message sent
        self._outstanding = 0
        self._type_sent: str | None = None
        self._type_received: str | None = None
        # received messages not yet acknowledged, in order: [seq, handled]
        self._owed: deque[list[Any]] = deque()
        # destination: (queue, filters), as written, in the order made
        self._subscriptions: dict[str, tuple[str | None, tuple[Filter | str, ...]]] = {}
        self._syncs: deque[tuple[int, bytes]] = deque()  # (token, payload) of sync()s

    # -- state -----------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """"handshake", then "ready", then "closed"."""
        if self.ended:
            return "closed"
        return "ready" if self._ready else "handshake"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def unacked(self) -> int:
        """Messages sent that the server has not acknowledged (0 without acks)."""
        return self._outstanding

    @property
    def has_room(self) -> bool:
        """Whether the ack window lets another MESSAGE go now."""
        return self.ready and (self.window is None or self._outstanding < self.window)

    @property
    def owed(self) -> int:
        """Received messages the client has not acknowledged yet (handled or not)."""
        return len(self._owed)

    @property
    def handled(self) -> int:
        """Of those, the ones handled in order from the oldest: what an ack would cover now."""
        count = 0
        for _, done in self._owed:
            if not done:
                break
            count += 1
        return count

    def data_to_send(self) -> bytes:
        """What to write to the server now (and forget)."""
        return b"".join(self.outgoing())

    # -- the handshake's timeout ---------------------------------------------------------------

    def _started(self, now: float) -> None:
        if self.timeout is not None:
            self._deadline = now + self.timeout

    def next_tick(self) -> float | None:
        return self._deadline if self.state == "handshake" else None

    def _tick(self, now: float) -> None:
        if self.state == "handshake" and self._deadline is not None and now >= self._deadline:
            self._end(common.MM2Timeout(f"no handshake reply within {self.timeout:g} s"))

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, data: bytes, now: float = 0.0) -> list[Event]:
        """Handle bytes from the server; the events they make, in order. A :class:`Closed`
        is the last one; after it the session ignores input."""
        return super().receive(data, now)

    def _received(self, data: bytes, now: float) -> None:
        if self.state == "handshake":
            reply = self._handshake.feed(data)
            if reply is None:
                return
            if isinstance(reply, ErrorFrame):
                self._end(common.MM2ServerError(reply.text), abort=False)
                return
            self._reply(reply)
            if self.ended:
                return
            data = self._handshake.trailing_data
        for frame in self._frames.feed(data):
            self._frame(frame)
            if self.ended:
                return

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        refusal = common.MM2ProtocolError(f"protocol error from the server: {error}")
        self._refuse(str(error), refusal)

    def _reply(self, reply: Handshake) -> None:
        try:
            minor = negotiate_minor(reply)
        except RemoteProtocolError as e:
            self._refuse(str(e), common.MM2HandshakeRefused(str(e), reply))
            return
        unsupported = unsupported_required(reply.required, self.supported)
        if unsupported:
            reason = str(UnsupportedExtensions(unsupported))
            self._refuse(reason, common.MM2HandshakeRefused(reason, reply, unsupported))
            return
        confirm = plan_confirm(self.hello, reply, self.supported, self.accept_suggested)
        if self._login is not None:  # the credential goes in step 3 only
            login = self._login
            confirm = evolve(
                confirm,
                required=tuple(login if e.name == login.name else e for e in confirm.required),
            )
        active = active_extensions(confirm)
        self._send(encode_handshake(confirm))
        self.server, self.confirm, self.minor, self.active = reply, confirm, minor, active
        self._json = "json" in active
        self._dotnet = active.id_of("dotnet")
        ack_id, batch_id = active.id_of("ack"), active.id_of("batch-ack")
        self._ack_in = frozenset(i for i in (ack_id, batch_id) if i is not None)
        self._ack_out = ack_id if ack_id is not None else batch_id
        windows = [1] if ack_id is not None else []
        batch = active.by_name("batch-ack")
        if batch is not None:
            windows.append(batch_ack_max_count(batch))
        self.window = min(windows, default=None)
        self._ready = True
        self._emit(Ready(reply, active, minor))

    def _frame(self, frame: Any) -> None:
        if isinstance(frame, MessageFrame):
            whole = self._reassembler.feed(frame)
            if whole is not None and not self._synced(whole):
                self._emit(self._message(whole))
        elif isinstance(frame, ExtensionFrame):
            self._extension(frame)
        elif isinstance(frame, ErrorFrame):
            self._end(common.MM2ServerError(frame.text), abort=False)
        # a COMMAND from the server means nothing to a client (no extension defines one
        # that way) and gets no reply (DECISIONS.md): ignored

    def _synced(self, frame: MessageFrame) -> bool:
        """Whether ``frame`` is the oldest :meth:`sync`'s message back (answered, acked)."""
        if not self._syncs or frame.properties:
            return False
        token, payload = self._syncs[0]
        if frame.destination != f"@{self.hello.identity}" or frame.payload != payload:
            return False
        self._syncs.popleft()
        if self._ack_out is not None:
            self._owed.append([frame.seq, True])
        self._answer(token)
        return True

    def _message(self, frame: MessageFrame) -> Message:
        value = decode_json(frame.payload) if self._json else None
        type_name = self._type_received if self._dotnet is not None else None
        if self._ack_out is not None:
            self._owed.append([frame.seq, False])
        return Message(
            frame.seq, frame.destination, frame.payload, dict(frame.properties), value, type_name
        )

    def _extension(self, frame: ExtensionFrame) -> None:
        extension = self.active.get(frame.ext_id)
        if extension is None:
            raise RemoteProtocolError(f"EXTENSION frame with id {frame.ext_id}: none is active")
        if frame.ext_id in self._ack_in:
            seq = parse_ack(frame)
            count = acked_count(self._oldest, self._outstanding, seq) if self._outstanding else 0
            self._outstanding -= count
            self._oldest = (self._oldest - 1 + count) % 0xFFFF + 1
            self._emit(Acked(count))
        elif frame.ext_id == self._dotnet:
            try:
                self._type_received = frame.payload.decode("ascii")
            except UnicodeDecodeError:
                raise RemoteProtocolError(f"dotnet type name not ASCII: {frame.payload[:40]!r}")
        else:
            self._emit(ExtensionReceived(extension, frame.payload))

    # -- sending -----------------------------------------------------------------------------

    def prepare(
        self,
        destination: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        type_name: str | None = None,
    ) -> Outgoing:
        """Check a message against the active extensions (ValueError, TypeError); ready to
        :meth:`send`. ``type_name`` needs ``dotnet``; None keeps the last type sent."""
        self._check_ready()
        data = message_payload(payload, self._json)
        check_message(destination, properties)
        if type_name is not None:
            if self._dotnet is None:
                raise ValueError("a type name needs the dotnet extension, which is not active")
            if not type_name or not type_name.isascii():
                raise ValueError(f"a dotnet type name is non-empty ASCII: {type_name!r}")
        props = tuple((properties or {}).items())
        return Outgoing(destination, data, props, type_name)

    def send(self, message: Outgoing) -> int:
        """Write ``message`` (its type frame first when the type changed); its seq.
        RuntimeError when the window is full: wait for :attr:`has_room`."""
        if not self.has_room:
            raise RuntimeError("no room in the ack window (or not ready)")
        if message.type_name is not None and message.type_name != self._type_sent:
            assert self._dotnet is not None
            self._write(ExtensionFrame(self._dotnet, message.type_name.encode("ascii")))
            self._type_sent = message.type_name
        seq = self._seq = next_seq(self._seq)
        frame = MessageFrame(seq, message.destination, message.payload, message.properties)
        for part in split_message(frame, self.fragment_size):
            self._write(part)
        if self.window is not None:
            if not self._outstanding:
                self._oldest = seq
            self._outstanding += 1
        return seq

    def subscribe(
        self, destination: str, queue: str | None = None, filters: Iterable[Filter | str] = ()
    ) -> None:
        """Write a ``subscribe`` command (no reply comes: DECISIONS.md); it replaces one
        to the same destination."""
        filters = tuple(filters)
        self._pubsub(encode_pubsub(subscription(destination, queue, filters)))
        self._subscriptions.pop(destination, None)
        self._subscriptions[destination] = queue, filters

    def unsubscribe(self, destination: str) -> None:
        self._pubsub(encode_pubsub(Unsubscribe(destination)))
        self._subscriptions.pop(destination, None)

    def sync(self) -> int:
        """A barrier: an empty message (``null`` with ``json``) to this client's own
        identity, answered (never emitted) when it is back: the broker has handled what was
        written before. MM2Error without an identity; RuntimeError with the window full."""
        self._check_ready()
        identity = self.hello.identity
        if not identity:
            raise common.MM2Error("sync needs an identity to send itself a message")
        payload = b"null" if self._json else b""
        self.send(self.prepare(f"@{identity}", payload))
        token = self._token()
        self._syncs.append((token, payload))
        return token

    def replay(self) -> list[Replay]:
        """The subscriptions written, then a :meth:`sync` (in force once it is answered);
        the login is the handshake, which a new session makes."""
        items = [
            Replay(f"subscribe {destination}", _subscribe(destination, queue, filters))
            for destination, (queue, filters) in self._subscriptions.items()
        ]
        if items and self.hello.identity:
            items.append(Replay("sync", lambda session, now: session.sync()))
        return items

    def _pubsub(self, command: Command) -> None:
        self._check_ready()
        if "pubsub" not in self.active:
            raise common.MM2Error("the pubsub extension is not active on this connection")
        self._write(command)

    def command(self, command: Command) -> None:
        """Write any COMMAND frame (a vendor extension's)."""
        self._check_ready()
        self._write(command)

    def send_extension(self, name: str, payload: bytes) -> None:
        """Write an EXTENSION frame of the active extension ``name``."""
        self._check_ready()
        ext_id = self.active.id_of(name)
        if ext_id is None:
            raise common.MM2Error(f"the {name} extension is not active on this connection")
        self._write(ExtensionFrame(ext_id, bytes(payload)))

    # -- the acks the client owes -------------------------------------------------------------

    def done(self, seq: int) -> None:
        """The received message ``seq`` is handled: the next ack may cover it (and every
        earlier one handled too). Nothing happens without an ack extension."""
        for entry in self._owed:
            if entry[0] == seq and not entry[1]:
                entry[1] = True
                return

    def flush_acks(self) -> int | None:
        """Write one cumulative ack for the messages handled in order from the oldest; the
        seq acknowledged, or None when there was nothing to acknowledge."""
        if self.state != "ready" or self._ack_out is None:
            return None
        last = None
        while self._owed and self._owed[0][1]:
            last = self._owed.popleft()[0]
        if last is not None:
            self._write(ack_frame(self._ack_out, last))
        return last

    # -- ending ------------------------------------------------------------------------------

    def send_error(self, text: str) -> None:
        """Write an ERROR frame and end the session (the driver then closes)."""
        self._refuse(text, common.MM2ConnectionClosed(f"closed with an ERROR frame: {text}"))

    def lost(self, error: BaseException | None = None) -> None:
        """The transport is gone."""
        super().lost(error or common.MM2ConnectionClosed("the connection is lost"))

    def _refuse(self, text: str, error: common.MM2Error) -> None:
        """Write an ERROR frame, then end with ``error`` once it is sent."""
        if not self.ended:
            self._write(ErrorFrame(text))
            self._end(error, abort=False)

    def _write(self, frame: Any) -> None:
        self._send(encode_frame(frame))

    def _check_ready(self) -> None:
        self.check_open()
        if self.state == "handshake":
            raise common.MM2Error("the handshake is not complete")


def _subscribe(destination: str, queue: str | None, filters: tuple[Filter | str, ...]) -> Any:
    return lambda session, now: session.subscribe(destination, queue, filters)
