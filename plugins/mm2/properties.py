"""Micromessage2 text inside frames, sans-IO: URL encoding, typed properties and commands.

- URL encoding is RFC 3986 percent-encoding of UTF-8: only ``A-Z a-z 0-9 - _ . ~`` stay
  as they are, a space is ``%20`` (never ``+``), escapes are written in upper-case hex.
- Properties (MESSAGE frames) are ``key:VALUE;`` pairs. VALUE is typed by its first
  character: ``N<long>`` (a signed 64-bit integer, read as :class:`int`), ``D<epoch
  seconds[.fraction]>`` (read as :class:`~decimal.Decimal`), ``T<url-encoded text>`` (read
  as :class:`str`).
- A COMMAND frame's payload is ``name;key=urlenc(value),key=urlenc(value)``.

What the peer got wrong raises :class:`~msgbroker.errors.RemoteProtocolError`; what a local
caller asks for that cannot be written raises :class:`ValueError` (:class:`TypeError` for a
property value of a type Micromessage2 has not: a bool, a float).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import quote, unquote_to_bytes

from attrs import field, frozen

from msgbroker.errors import RemoteProtocolError

#: the spec's FIELD: 7-bit lower-case ASCII letters, digits and hyphen (names, keys)
FIELD_RE = re.compile(r"[a-z0-9-]+")
#: property and filter keys as read: FIELD, plus the upper case and ``_`` that the C#
#: reference writes (vector V8, ``last_name``); never written by :func:`encode_properties`
LENIENT_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")

#: a typed property value: N is int, D is Decimal, T (and a leniently read untyped value) is str
PropertyValue = int | Decimal | str
Properties = tuple[tuple[str, PropertyValue], ...]

_N_MIN, _N_MAX = -(2**63), 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NUMBER_RE = re.compile(r"-?[0-9]{1,19}")
# no exponent, no lone dot: exactly what format(value, "f") writes back
_DATE_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_PRINTABLE_RE = re.compile(r"[\x20-\x7e]*")
# raw characters a peer may leave unescaped: printable ASCII (the caller has already split
# on its own separators), '%' only as the start of a two-hex-digit escape
_RAW_OK_RE = re.compile(r"(?:[\x20-\x24\x26-\x7e]|%[0-9A-Fa-f]{2})*")

# -- URL encoding ---------------------------------------------------------------------------


def urlencode(text: str) -> str:
    """``text`` percent-encoded (RFC 3986 unreserved characters stay); ValueError for a
    string that is not valid Unicode (lone surrogates)."""
    return quote(text, safe="", encoding="utf-8", errors="strict")


def urldecode(text: str) -> str:
    """The text ``text`` encodes. A ``%`` not followed by two hex digits, a control or
    non-ASCII character, or escapes that do not decode as UTF-8 are the peer's error.
    Unreserved-or-not is not checked: a peer may leave ``"`` or ``/`` unescaped."""
    if "%" not in text and text.isascii() and text.isprintable():
        return text  # the common case: nothing to decode
    if _RAW_OK_RE.fullmatch(text) is None:
        raise RemoteProtocolError(f"bad URL encoding {text[:40]!r}")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"URL-encoded text is not UTF-8: {text[:40]!r}") from None


def is_valid_name(text: str) -> bool:
    """True for a destination or identity this codec reads and writes: 0..255 characters of
    printable ASCII (space included). The vectors make these strings ASCII; control
    characters in a topic or identity would only end up in someone's logs."""
    return len(text) <= 255 and _PRINTABLE_RE.fullmatch(text) is not None


def ascii_text(data: bytes, what: str) -> str:
    """``data`` as a str; the peer's error unless it is ASCII."""
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{what} is not ASCII: {data[:40]!r}") from None


# -- typed values ---------------------------------------------------------------------------


def parse_value(text: str) -> PropertyValue:
    """One FILTER_VALUE (``N42``, ``D1413198000.0``, ``THello%20world``) as a typed value."""
    kind, rest = text[:1], text[1:]
    if kind == "N":
        if _NUMBER_RE.fullmatch(rest) is None or not _N_MIN <= int(rest) <= _N_MAX:
            raise RemoteProtocolError(f"bad number value {text[:40]!r}")
        return int(rest)
    if kind == "D":
        if _DATE_RE.fullmatch(rest) is None:
            raise RemoteProtocolError(f"bad date value {text[:40]!r}")
        return Decimal(rest)
    if kind == "T":
        return urldecode(rest)
    raise RemoteProtocolError(f"value without a type prefix (N, D or T): {text[:40]!r}")


def encode_value(value: PropertyValue | datetime) -> str:
    """A typed value's wire form. An int is N (64-bit signed); a Decimal is D, written
    without exponent; an aware datetime is D too (microseconds exactly); a str is T."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a property value (use N0 or N1)")
    if isinstance(value, int):
        if not _N_MIN <= value <= _N_MAX:
            raise ValueError(f"number out of the 64-bit range: {value}")
        return f"N{value}"
    if isinstance(value, datetime):
        return f"D{format(datetime_to_epoch(value), 'f')}"
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"a date is a finite number of seconds: {value}")
        return f"D{format(value, 'f')}"
    if isinstance(value, str):
        return f"T{urlencode(value)}"
    raise TypeError(f"not a property value: {value!r}")


def datetime_to_epoch(moment: datetime) -> Decimal:
    """Seconds since the Unix epoch, exact to the microsecond, with no trailing zeros in the
    fraction (whole seconds have none); ValueError if naive."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a naive datetime has no epoch time; give it a tzinfo")
    delta = moment - _EPOCH
    seconds = Decimal(delta.days * 86400 + delta.seconds)
    if not delta.microseconds:
        return seconds
    fraction = Decimal(delta.microseconds).scaleb(-6)
    return seconds + Decimal(str(fraction).rstrip("0"))


def epoch_to_datetime(seconds: Decimal | int) -> datetime:
    """The UTC datetime of a D value, rounded to the microsecond (datetime's precision);
    OverflowError outside datetime's years 1..9999."""
    micros = int(Decimal(seconds).scaleb(6).to_integral_value())
    return _EPOCH + timedelta(microseconds=micros)


# -- properties -----------------------------------------------------------------------------


def as_properties(
    value: Mapping[str, PropertyValue] | Iterable[tuple[str, PropertyValue]],
) -> Properties:
    """Properties as an immutable ordered tuple of (key, value) pairs (attrs converter)."""
    if isinstance(value, Mapping):
        return tuple(value.items())
    return tuple((key, item) for key, item in value)


def parse_properties(data: bytes) -> Properties:
    """A MESSAGE frame's properties field. Empty items are skipped, so the last ``;`` may be
    missing. Read leniently: keys may hold upper case and ``_``, and a value without a type
    prefix is text (V8's ``last_name:kalle;``) — unless it starts with N, D or T, when it
    must be a valid value of that type. A key twice is an error (which would filter?)."""
    if not data:
        return ()
    text = ascii_text(data, "properties")
    out: list[tuple[str, PropertyValue]] = []
    seen: set[str] = set()
    for item in text.split(";"):
        if not item:
            continue
        key, colon, raw = item.partition(":")
        if not colon or LENIENT_KEY_RE.fullmatch(key) is None:
            raise RemoteProtocolError(f"bad property {item[:40]!r}")
        if key in seen:
            raise RemoteProtocolError(f"property {key!r} given twice")
        seen.add(key)
        value = parse_value(raw) if raw[:1] in ("N", "D", "T") else urldecode(raw)
        out.append((key, value))
    return tuple(out)


def encode_properties(properties: Mapping[str, PropertyValue] | Properties) -> bytes:
    """``key:VALUE;`` for each property, every key a FIELD and every value typed."""
    pairs = as_properties(properties)
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a property key given twice: {keys}")
    parts = []
    for key, value in pairs:
        if FIELD_RE.fullmatch(key) is None:
            raise ValueError(f"property key is not a FIELD ([a-z0-9-]+): {key!r}")
        parts.append(f"{key}:{encode_value(value)};")
    return "".join(parts).encode("ascii")


# -- commands -------------------------------------------------------------------------------

Arguments = tuple[tuple[str, str], ...]


def as_arguments(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> Arguments:
    """Arguments as an immutable ordered tuple of (key, value) pairs (attrs converter)."""
    if isinstance(value, Mapping):
        return tuple(value.items())
    return tuple((key, item) for key, item in value)


@frozen(slots=True)
class Command:
    """A COMMAND frame: a FIELD name and its arguments, in order. A key may repeat (a
    subscribe names several filters), so they are pairs, not a mapping; values are decoded."""

    name: str
    args: Arguments = field(default=(), converter=as_arguments)

    def get(self, key: str, default: str | None = None) -> str | None:
        """The first value given for ``key``."""
        for name, value in self.args:
            if name == key:
                return value
        return default

    def get_all(self, key: str) -> list[str]:
        """Every value given for ``key``, in order."""
        return [value for name, value in self.args if name == key]


def parse_command(data: bytes) -> Command:
    """``name;key=value,key=value`` (a COMMAND frame's payload). Empty arguments are skipped,
    like empty extension-list items; a name alone (with or without ``;``) has no arguments."""
    text = ascii_text(data, "command")
    name, _, rest = text.partition(";")
    if FIELD_RE.fullmatch(name) is None:
        raise RemoteProtocolError(f"bad command name {name[:40]!r}")
    args = []
    for item in rest.split(","):
        if not item:
            continue
        key, equals, value = item.partition("=")
        if not equals or FIELD_RE.fullmatch(key) is None:
            raise RemoteProtocolError(f"bad command argument {item[:40]!r}")
        args.append((key, urldecode(value)))
    return Command(name, tuple(args))


def encode_command(command: Command) -> bytes:
    """The payload of ``command``'s COMMAND frame."""
    if FIELD_RE.fullmatch(command.name) is None:
        raise ValueError(f"command name is not a FIELD ([a-z0-9-]+): {command.name!r}")
    for key, _ in command.args:
        if FIELD_RE.fullmatch(key) is None:
            raise ValueError(f"argument key is not a FIELD ([a-z0-9-]+): {key!r}")
    args = ",".join(f"{key}={urlencode(value)}" for key, value in command.args)
    return f"{command.name};{args}".encode("ascii") if args else command.name.encode("ascii")
