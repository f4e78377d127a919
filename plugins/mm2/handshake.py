"""The Micromessage2 three-step handshake, sans-IO: its messages, extension lists, version
negotiation and the extensions a connection ends up with.

Each step is one message with no frame-flags byte and no overall length (big-endian)::

    major u8, minor u8, flags u8, idlen u8, id, reqlen u16, req, optlen u16, opt

Step 1 the client's hello, step 2 the server's reply, step 3 the client's confirmation; the
step-3 lists (required, then optional) are the active extensions and number them from 1.
Major must be 1; any minor is accepted and the lower is used; the server writes minor 1.
Instead of a step, a peer may send an ERROR frame and close: a first byte with bit 0x04 set
is one (major 1 never sets it).

An extension list is ``name[:key=urlenc(value),...]`` items separated by ``;``; empty items
are ignored; names and keys are FIELDs (``[a-z0-9-]+``); vendor extensions start ``x-``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from attrs import field, frozen

from msgbroker.errors import RemoteProtocolError

from .frames import DEFAULT_MAX_PAYLOAD, ERROR, LARGE, ErrorFrame, FrameDecoder
from .properties import (
    FIELD_RE,
    Arguments,
    as_arguments,
    ascii_text,
    is_valid_name,
    urldecode,
    urlencode,
)

#: the version this implementation speaks
MAJOR = 1
MINOR = 1
#: our vendor extension carrying a login scheme and credential, in the step-3
#: confirmation: ``x-login:scheme=password,credential=s3cret`` (docs/mm2.md, "Login")
LOGIN_EXTENSION = "x-login"
#: batch-ack's window when its handshake entry names none (the spec)
DEFAULT_BATCH_ACK_COUNT = 10

_DECIMAL_RE = re.compile(r"[0-9]{1,5}")

# -- extension lists ------------------------------------------------------------------------


@frozen(slots=True)
class Extension:
    """One extension-list item: a name and its properties in order (values decoded)."""

    name: str
    properties: Arguments = field(default=(), converter=as_arguments)

    @property
    def vendor(self) -> bool:
        """A vendor extension (``x-`` prefix) rather than an official one."""
        return self.name.startswith("x-")

    def get(self, key: str, default: str | None = None) -> str | None:
        for name, value in self.properties:
            if name == key:
                return value
        return default


def parse_extension_list(text: str) -> tuple[Extension, ...]:
    """Read an extension list. A property written ``key:value`` is read as ``key=value``:
    the spec writes batch-ack's window that way (``batch-ack:max-count:100``), and
    DECISIONS.md accepts it. A name or a property key twice is an error (which one counts?)."""
    out: list[Extension] = []
    names: set[str] = set()
    for item in text.split(";"):
        if not item:
            continue
        name, _, rest = item.partition(":")
        if FIELD_RE.fullmatch(name) is None:
            raise RemoteProtocolError(f"bad extension name {name[:40]!r}")
        if name in names:
            raise RemoteProtocolError(f"extension {name!r} listed twice")
        names.add(name)
        properties: list[tuple[str, str]] = []
        for prop in rest.split(","):
            if not prop:
                continue
            key, equals, value = prop.partition("=")
            if not equals:
                key, equals, value = prop.partition(":")
            if not equals or FIELD_RE.fullmatch(key) is None:
                raise RemoteProtocolError(f"bad property {prop[:40]!r} of extension {name!r}")
            if any(key == seen for seen, _ in properties):
                raise RemoteProtocolError(f"property {key!r} of extension {name!r} given twice")
            properties.append((key, urldecode(value)))
        out.append(Extension(name, tuple(properties)))
    return tuple(out)


def encode_extension_list(extensions: Iterable[Extension]) -> str:
    """The list's text: ``;`` between items, ``:`` and ``key=urlenc(value)`` for properties."""
    items = []
    for extension in extensions:
        if FIELD_RE.fullmatch(extension.name) is None:
            raise ValueError(f"extension name is not a FIELD ([a-z0-9-]+): {extension.name!r}")
        if any(FIELD_RE.fullmatch(key) is None for key, _ in extension.properties):
            raise ValueError(f"a property key of {extension.name!r} is not a FIELD")
        props = ",".join(f"{key}={urlencode(value)}" for key, value in extension.properties)
        items.append(f"{extension.name}:{props}" if props else extension.name)
    return ";".join(items)


def _as_extensions(value: Iterable[Extension | str]) -> tuple[Extension, ...]:
    """Extensions, where a plain name stands for an extension without properties."""
    return tuple(Extension(item) if isinstance(item, str) else item for item in value)


# -- handshake messages ---------------------------------------------------------------------


@frozen(slots=True)
class Handshake:
    """One handshake step. ``flags`` is reserved: written 0, read and kept whatever it is,
    since a later minor version may use it and minors must interoperate (the spec)."""

    identity: str
    required: tuple[Extension, ...] = field(default=(), converter=_as_extensions)
    optional: tuple[Extension, ...] = field(default=(), converter=_as_extensions)
    major: int = MAJOR
    minor: int = MINOR
    flags: int = 0


def encode_handshake(handshake: Handshake) -> bytes:
    """A handshake message's bytes; ValueError for one the protocol cannot carry."""
    major, minor, flags = handshake.major, handshake.minor, handshake.flags
    if not all(0 <= value <= 255 for value in (major, minor, flags)):
        raise ValueError(f"version or flags out of 0..255: {major}, {minor}, {flags}")
    if major & ERROR:
        raise ValueError(f"major {major} has bit 0x04 set: the peer would read an ERROR frame")
    if not is_valid_name(handshake.identity):
        raise ValueError(f"identity is not 0..255 printable ASCII: {handshake.identity!r}")
    identity = handshake.identity.encode("ascii")
    parts = [bytes((major, minor, flags, len(identity))), identity]
    for extensions in (handshake.required, handshake.optional):
        text = encode_extension_list(extensions).encode("ascii")
        if len(text) > 0xFFFF:
            raise ValueError(f"extension list of {len(text)} bytes (at most 65535)")
        parts += [len(text).to_bytes(2, "big"), text]
    return b"".join(parts)


def _parse_handshake(buf: bytearray, max_size: int | None) -> tuple[Handshake, int] | int:
    """The handshake at the start of ``buf`` as (message, its size), or the number of bytes
    needed to read further. Fields are checked as soon as they are complete; the size
    against ``max_size`` as soon as a length field shows the message must exceed it."""
    size = len(buf)
    if size < 4:
        return 4
    required_at = 4 + buf[3]
    _check_size(required_at + 4, max_size)  # both list lengths (u16) follow the identity
    if size < required_at:
        return required_at
    identity = ascii_text(bytes(buf[4:required_at]), "identity")
    if not is_valid_name(identity):
        raise RemoteProtocolError(f"identity with control characters: {identity[:40]!r}")
    lists: list[tuple[Extension, ...]] = []
    at = required_at
    for what in ("required", "optional"):
        if size < at + 2:
            return at + 2
        end = at + 2 + int.from_bytes(buf[at : at + 2], "big")
        _check_size(end + 2 if what == "required" else end, max_size)
        if size < end:
            return end
        text = ascii_text(bytes(buf[at + 2 : end]), f"{what} extension list")
        lists.append(parse_extension_list(text))
        at = end
    required, optional = lists
    return Handshake(identity, required, optional, buf[0], buf[1], buf[2]), at


def _check_size(at_least: int, max_size: int | None) -> None:
    if max_size is not None and at_least > max_size:
        raise RemoteProtocolError(f"handshake of {at_least} bytes or more (at most {max_size})")


class HandshakeDecoder:
    """Incremental parser of one handshake step (or the ERROR frame sent instead).

    :meth:`feed` returns None until the message is complete, then the :class:`Handshake`
    or :class:`ErrorFrame`; the bytes after it are in :attr:`trailing_data`, for the next
    decoder (a step-3 one, or the :class:`FrameDecoder`). The version is not checked
    here: :func:`negotiate_minor` does that, so a parser-only test can read major 3.

    ``max_size`` bounds the message (or the ERROR frame) in bytes: a server reads the
    handshake before any login, so a stranger must not make it hold 128 KiB per connection.
    A message over it is refused as soon as its length fields show it, before its bytes
    arrive (None: only the format's own bounds, 255 + 2 x 65535 bytes of fields).
    """

    def __init__(self, max_size: int | None = None) -> None:
        self._max = max_size
        self._buf = bytearray()
        self._need = 1
        self._frames: FrameDecoder | None = None  # set when the peer sent an ERROR frame
        self._result: Handshake | ErrorFrame | None = None
        self._error: RemoteProtocolError | None = None
        #: bytes received after the message, once it is complete
        self.trailing_data = b""

    def feed(self, data: bytes) -> Handshake | ErrorFrame | None:
        if self._result is not None:
            raise RuntimeError("the handshake message is complete; use trailing_data")
        if self._error is not None:
            raise self._error
        try:
            result = self._feed(data)
        except RemoteProtocolError as exc:
            self._error = exc
            self._buf = bytearray()  # nothing more will be read: hold nothing
            self._frames = None
            raise
        self._result = result
        return result

    def _feed(self, data: bytes) -> Handshake | ErrorFrame | None:
        if self._frames is not None:
            self._frames.receive_data(data)
            return self._error_frame(self._frames)
        self._buf += data
        if len(self._buf) < self._need:
            return None
        if self._buf[0] & ERROR:  # not a handshake: the peer refuses and closes
            frames = self._frames = FrameDecoder(self._error_max_payload(self._buf[0]))
            frames.receive_data(bytes(self._buf))
            self._buf.clear()
            return self._error_frame(frames)
        parsed = _parse_handshake(self._buf, self._max)
        if isinstance(parsed, int):
            self._need = parsed
            return None
        handshake, end = parsed
        self.trailing_data = bytes(self._buf[end:])
        self._buf.clear()
        return handshake

    def _error_max_payload(self, flags: int) -> int:
        """The ERROR frame's payload bound that keeps the whole frame within ``max_size``
        (its head: the flags byte and a 1- or 4-byte length)."""
        if self._max is None:
            return DEFAULT_MAX_PAYLOAD
        return max(0, self._max - (5 if flags & LARGE else 2))

    def _error_frame(self, frames: FrameDecoder) -> ErrorFrame | None:
        frame = frames.next_event()
        if frame is None:
            return None
        assert isinstance(frame, ErrorFrame)  # ERROR wins over every other type bit
        self.trailing_data = frames.buffered
        return frame


# -- negotiation ----------------------------------------------------------------------------


class UnsupportedExtensions(RemoteProtocolError):
    """The peer requires extensions this side does not implement: send an ERROR frame with
    ``str(error)`` (``unsupported extensions: a, b``) and close."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        super().__init__(f"unsupported extensions: {', '.join(self.names)}")


def negotiate_minor(peer: Handshake, own_minor: int = MINOR) -> int:
    """The minor version the connection uses: the lower of the two. Only major 1 exists;
    another major is the peer's error (answer with an ERROR frame and close)."""
    if peer.major != MAJOR:
        raise RemoteProtocolError(f"unsupported major version {peer.major} (only {MAJOR})")
    return min(peer.minor, own_minor)


def unsupported_required(
    required: Iterable[Extension], supported: Collection[str]
) -> tuple[str, ...]:
    """The names of the ``required`` extensions not in ``supported``, in list order. A
    server checks the hello's required list; a client the reply's."""
    return tuple(ext.name for ext in required if ext.name not in supported)


def check_required(required: Iterable[Extension], supported: Collection[str]) -> None:
    """Raise :class:`UnsupportedExtensions` if any required extension is not supported."""
    names = unsupported_required(required, supported)
    if names:
        raise UnsupportedExtensions(names)


@frozen(slots=True)
class ActiveExtensions:
    """The extensions of a connection, in the step-3 order: id ``i`` is ``extensions[i-1]``."""

    extensions: tuple[Extension, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(ext.name for ext in self.extensions)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def id_of(self, name: str) -> int | None:
        """The id EXTENSION frames of ``name`` carry; None when it is not active."""
        for index, ext in enumerate(self.extensions, 1):
            if ext.name == name:
                return index
        return None

    def get(self, ext_id: int) -> Extension | None:
        """The extension with id ``ext_id``; None for an id no extension has."""
        return self.extensions[ext_id - 1] if 1 <= ext_id <= len(self.extensions) else None

    def by_name(self, name: str) -> Extension | None:
        ext_id = self.id_of(name)
        return None if ext_id is None else self.extensions[ext_id - 1]


def active_extensions(confirm: Handshake) -> ActiveExtensions:
    """The step-3 lists, required then optional, numbered from 1. A name in both lists
    would have two ids, and more than 255 cannot all have one: both are errors."""
    extensions = confirm.required + confirm.optional
    names = [ext.name for ext in extensions]
    if len(set(names)) != len(names):
        raise RemoteProtocolError("an extension in both the required and the optional list")
    if len(extensions) > 255:
        raise RemoteProtocolError(f"{len(extensions)} extensions (ids are 1..255)")
    return ActiveExtensions(extensions)


def check_confirm(
    hello: Handshake, reply: Handshake, confirm: Handshake, supported: Collection[str]
) -> ActiveExtensions:
    """The server's check of step 3, given steps 1 and 2: the active extensions, or the
    peer's error when the confirmation changes major or identity, uses an extension the
    server does not support (:class:`UnsupportedExtensions`), or leaves out one the server
    required. The client may drop extensions of its own hello: step 3 is its final word."""
    negotiate_minor(confirm)
    if confirm.identity != hello.identity:
        raise RemoteProtocolError(
            f"identity {confirm.identity[:40]!r} in step 3, {hello.identity[:40]!r} in step 1"
        )
    active = active_extensions(confirm)
    check_required(active.extensions, supported)
    missing = [ext.name for ext in reply.required if ext.name not in active]
    if missing:
        raise RemoteProtocolError(f"required extensions not confirmed: {', '.join(missing)}")
    return active


def batch_ack_max_count(extension: Extension) -> int:
    """batch-ack's window: ``max-count``, or its alias ``count``, default 10 (DECISIONS.md).
    At most 65535, the number of sequence numbers, so that a cumulative ack is unambiguous."""
    value = extension.get("max-count", extension.get("count"))
    if value is None:
        return DEFAULT_BATCH_ACK_COUNT
    if _DECIMAL_RE.fullmatch(value) is None or not 1 <= int(value) <= 0xFFFF:
        raise RemoteProtocolError(f"bad batch-ack max-count {value[:20]!r} (1..65535)")
    return int(value)
