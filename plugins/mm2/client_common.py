"""What the Micromessage2 client session (:mod:`.client_session`) is made of, with no state
of its own: the default port and timeout, the errors, the session's events (the received
:class:`Message`, :class:`Ready`, :class:`Acked`, ...) and :class:`Outgoing`, the
step-3 plan of the handshake, checking what the caller asks to send, and
:class:`MM2Commands`, what both clients send the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from msgbroker.clientkit.session import ConnectionClosed, Ended, SessionAttribute
from msgbroker.errors import RemoteProtocolError

from .codec import (
    DEFAULT_BATCH_ACK_COUNT,
    ActiveExtensions,
    Command,
    Extension,
    Filter,
    Handshake,
    PropertyValue,
    Subscribe,
    batch_ack_max_count,
    encode_properties,
    parse_extension_list,
    parse_filter,
)
from .properties import is_valid_name

if TYPE_CHECKING:
    from .client_session import ClientSession

#: the broker's Micromessage2 port (DESIGN.md)
DEFAULT_PORT = 4447
#: how long (s) the handshake, or a publish waiting for room in the ack window, may take
TIMEOUT = 30.0
#: the extensions the clients implement themselves
BUILTIN_EXTENSIONS = frozenset({"pubsub", "ack", "batch-ack", "json", "dotnet"})
#: what a client requires and offers unless told otherwise: pubsub (subscribe needs it)
#: and, when the server offers it too, batch-ack
DEFAULT_REQUIRED: tuple[str | Extension, ...] = ("pubsub",)
DEFAULT_OPTIONAL: tuple[str | Extension, ...] = ("batch-ack",)

ExtensionSpec = str | Extension

# -- errors ---------------------------------------------------------------------------------


class MM2Error(Exception):
    """Base class of what the Micromessage2 clients raise on purpose."""


class MM2ServerError(MM2Error):
    """The server sent an ERROR frame (and closes the connection); ``text`` is its reason."""

    def __init__(self, text: str) -> None:
        super().__init__(f"the server refused: {text}")
        self.text = text


class MM2HandshakeRefused(MM2Error):
    """The client refused the server's handshake reply (step 2) and closed after an ERROR
    frame: the server speaks another major version, or requires extensions the client does
    not support. ``server_required`` is the reply's required list (names), ``unsupported``
    the names among them the client lacks, ``major`` the server's major version."""

    def __init__(self, reason: str, server: Handshake, unsupported: Iterable[str] = ()) -> None:
        self.server_required = tuple(ext.name for ext in server.required)
        self.unsupported = tuple(unsupported)
        self.major = server.major
        required = ";".join(self.server_required) or "nothing"
        super().__init__(f"{reason} (the server {server.identity!r} requires {required})")


class MM2ConnectionClosed(MM2Error, ConnectionClosed):
    """The connection ended (or was never usable) before the operation completed."""


class MM2Timeout(MM2Error, TimeoutError):
    """The handshake did not complete, or a publish found no room in the ack window, in time."""


class MM2ProtocolError(MM2Error):
    """The server broke the protocol; the client sent it an ERROR frame and closed."""


# -- a received message ---------------------------------------------------------------------


@frozen
class Message:
    """A message the server delivered (reassembled when it came in fragments).

    ``properties`` are typed (N ``int``, D ``Decimal``, T ``str``); ``value`` is the payload
    decoded as JSON when the ``json`` extension is active, else ``None``; ``type_name`` is
    the ``dotnet`` type in force for it (the last one the server sent), else ``None``."""

    seq: int
    destination: str
    payload: bytes
    properties: dict[str, PropertyValue] = field(factory=dict)
    value: Any = None
    type_name: str | None = None

    @property
    def sender(self) -> str | None:
        """The sender's identity for a unicast (destination ``@<sender>``), else ``None``."""
        return self.destination[1:] if self.destination.startswith("@") else None


# -- the handshake's step 3 -----------------------------------------------------------------


def _extension(item: ExtensionSpec) -> Extension:
    if not isinstance(item, str):
        return item
    try:
        parsed = parse_extension_list(item)
    except RemoteProtocolError as e:
        raise ValueError(str(e)) from None
    if len(parsed) != 1:
        raise ValueError(f"not one extension: {item!r}")
    return parsed[0]


def as_extensions(items: Iterable[ExtensionSpec]) -> tuple[Extension, ...]:
    """Extensions from :class:`Extension` values or their text (``"batch-ack"``,
    ``"batch-ack:max-count=50"``); ValueError for a bad one or a name twice."""
    out = tuple(_extension(item) for item in items)
    names = [ext.name for ext in out]
    if len(set(names)) != len(names):
        raise ValueError(f"an extension given twice: {names}")
    return out


def check_own(extensions: Iterable[Extension]) -> None:
    """ValueError for a ``batch-ack`` entry of the client's own lists with a bad window."""
    for ext in extensions:
        if ext.name == "batch-ack":
            try:
                batch_ack_max_count(ext)
            except RemoteProtocolError as e:
                raise ValueError(str(e)) from None


def plan_confirm(
    hello: Handshake, reply: Handshake, supported: Collection[str], accept_suggested: bool
) -> Handshake:
    """The client's step 3, given its step 1 and the server's step 2 (already checked: the
    client supports everything the server requires).

    Required: the client's required, then the server's required that the client did not
    require (the server's entry, with its properties). Optional: the client's optional
    extensions that the server offered too (required by the server counts, and then they
    are in the required list already), in the client's order; with ``accept_suggested``
    also the server's optional ones the client supports but did not offer (the spec's
    "we'll use the optional Y and Z"; vector V3). ``batch-ack`` is written with an explicit
    ``max-count``: the smaller of the windows the two sides named (10 when one named none);
    a bad window in the server's lists is its error. Step 3 carries the negotiated minor.
    """
    required = list(hello.required)
    names = {ext.name for ext in required}
    for ext in reply.required:
        if ext.name not in names:
            required.append(ext)
            names.add(ext.name)
    offered = {ext.name for ext in reply.optional}
    optional = [ext for ext in hello.optional if ext.name in offered and ext.name not in names]
    if accept_suggested:
        own = {ext.name for ext in hello.optional}
        optional += [
            ext
            for ext in reply.optional
            if ext.name in supported and ext.name not in own and ext.name not in names
        ]
    everything = (*hello.required, *hello.optional, *reply.required, *reply.optional)
    counts = [batch_ack_max_count(ext) for ext in everything if ext.name == "batch-ack"]
    window = min(counts, default=DEFAULT_BATCH_ACK_COUNT)

    def final(ext: Extension) -> Extension:
        if ext.name != "batch-ack":
            return ext
        others = tuple((k, v) for k, v in ext.properties if k not in ("max-count", "count"))
        return Extension("batch-ack", (("max-count", str(window)), *others))

    return Handshake(
        hello.identity,
        tuple(final(ext) for ext in required),
        tuple(final(ext) for ext in optional),
        hello.major,
        min(hello.minor, reply.minor),
        hello.flags,
    )


# -- what the caller asks to send ---------------------------------------------------------------


def message_payload(payload: Any, json_active: bool) -> bytes:
    """The bytes of a MESSAGE payload. Bytes go as they are (with ``json`` active they must
    parse as JSON: ValueError otherwise); with ``json`` active any other value is
    serialized; without it, TypeError for what is not bytes."""
    if isinstance(payload, bytes | bytearray | memoryview):
        data = bytes(payload)
        if json_active:
            try:
                json.loads(data)
            except ValueError as e:
                raise ValueError(f"the json extension is active: payload is not JSON ({e})")
        return data
    if not json_active:
        raise TypeError(f"a payload is bytes unless json is active, not {type(payload).__name__}")
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_json(payload: bytes) -> Any:
    """A received payload on a connection with ``json`` active; the server's error if it is
    not JSON (DECISIONS.md: ERROR and close)."""
    try:
        return json.loads(payload)
    except ValueError as e:
        raise RemoteProtocolError(f"payload is not JSON although json is active: {e}") from None


def check_message(
    destination: str, properties: Mapping[str, PropertyValue | datetime] | None
) -> None:
    """ValueError (TypeError for a property value of no Micromessage2 type) for a
    destination or properties a MESSAGE frame cannot carry."""
    if not destination or not is_valid_name(destination):
        raise ValueError(f"destination is not 1..255 printable ASCII: {destination!r}")
    if properties:
        props = encode_properties(properties)  # type: ignore[arg-type]
        if len(props) > 0xFFFF:
            raise ValueError(f"properties of {len(props)} bytes do not fit a frame (65535)")


def subscription(destination: str, queue: str | None, filters: Iterable[Filter | str]) -> Subscribe:
    """A :class:`Subscribe`; a filter may be given as its text (``"price>=N10"``)."""
    out = []
    for item in filters:
        try:
            out.append(parse_filter(item) if isinstance(item, str) else item)
        except RemoteProtocolError as e:
            raise ValueError(str(e)) from None
    return Subscribe(destination, queue, tuple(out))


class MM2Commands:
    """What both Micromessage2 clients send the same way: commands and EXTENSION frames,
    written at once through ``_command(write)`` (the Twisted client holds them until the
    handshake is done), :meth:`unicast` as a ``publish`` to ``@identity``, and the
    session's state."""

    session: ClientSession

    def _command(self, write: Callable[[], object]) -> None:
        raise NotImplementedError

    def _publish(self, message: tuple[Any, ...], timeout: float | None) -> Any:
        raise NotImplementedError

    active = SessionAttribute("the active extensions (once the handshake is done)")
    unacked = SessionAttribute("published messages written, not yet acknowledged by the server")

    def publish(
        self,
        destination: str,
        payload: Any,
        properties: Mapping[str, PropertyValue | datetime] | None = None,
        *,
        type_name: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send a MESSAGE; its seq — a Deferred fired once written in the Twisted client,
        which queues what does not fit the ack window; the blocking one waits for room,
        reading acks. ``payload`` is bytes, or with ``json`` active any JSON value;
        ``type_name`` needs ``dotnet``. ValueError or TypeError at once (once the handshake
        is done) for what cannot be sent; :class:`MM2Timeout` when it waited ``timeout``
        seconds (default: the client's) for room in the window, and then it is never sent."""
        return self._publish((destination, payload, properties, type_name), timeout)

    def unicast(self, identity: str, payload: Any, *args: Any, **kw: Any) -> Any:
        """:meth:`publish` to ``@identity``."""
        return self.publish(f"@{identity}", payload, *args, **kw)

    def subscribe(
        self, destination: str, queue: str | None = None, filters: Iterable[Filter | str] = ()
    ) -> None:
        """Write a ``subscribe`` command; filters are :class:`Filter` values or their text
        (``"price>=N10"``). No reply comes: it takes effect before any later frame."""
        filters = tuple(filters)
        self._command(lambda: self.session.subscribe(destination, queue, filters))

    def unsubscribe(self, destination: str) -> None:
        self._command(lambda: self.session.unsubscribe(destination))

    def command(self, command: Command) -> None:
        """Write any COMMAND frame."""
        self._command(lambda: self.session.command(command))

    def send_extension(self, name: str, payload: bytes) -> None:
        """Write an EXTENSION frame of the active extension ``name``."""
        self._command(lambda: self.session.send_extension(name, payload))


# -- events ---------------------------------------------------------------------------------


@frozen
class Ready:
    """The handshake is complete: step 3 is written. ``active`` numbers the extensions."""

    server: Handshake
    active: ActiveExtensions
    minor: int


@frozen
class Acked:
    """The server acknowledged ``count`` published messages (0 for a stale ack)."""

    count: int


@frozen
class ExtensionReceived:
    """An EXTENSION frame of an active extension the client gives no meaning itself (a
    vendor ``x-...`` one, say)."""

    extension: Extension
    payload: bytes


#: the session is over: ``error`` says why (the server's ERROR frame, or the client's
#: refusal, whose ERROR frame is in :meth:`ClientSession.data_to_send`)
Closed = Ended

Event = Ready | Message | Acked | ExtensionReceived | Closed


@frozen
class Outgoing:
    """A message checked and ready to send (:meth:`ClientSession.prepare`)."""

    destination: str
    payload: bytes
    properties: tuple[tuple[str, Any], ...]
    type_name: str | None
