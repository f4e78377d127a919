"""The NATS client protocol, sans-IO (no Twisted, no sockets): what a client writes
(CONNECT, PUB, SUB, UNSUB, PING, PONG) and a parser of what a server sends (INFO, MSG,
HMSG, PING, PONG, +OK, -ERR), after https://docs.nats.io/reference/reference-protocols/nats-protocol.

And how a topic of any protocol becomes one subject token (``topic_token``), reversibly
(``token_topic``): NATS subjects are dot-separated tokens of printable bytes without
whitespace, where a token that is exactly ``*`` or ``>`` is a wildcard, while a topic may
hold spaces, dots, ``*``, ``>``, any Unicode. ASCII letters, digits and ``-_/:@!~+=,;``
stand for themselves; every other byte of the topic's UTF-8 (surrogates passed through, so
every ``str`` has one) is ``%XX`` (upper-case hex); the empty topic is ``%``. A token that
would pass :data:`MAX_TOKEN` bytes is ``#`` and the SHA-256 of the topic in hex instead:
not reversible, but a publication carries its topic in its body, so the token only has to
tell topics apart, and a subject stays far below the server's control-line limit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from attrs import frozen

__all__ = [
    "MAX_TOKEN",
    "PING",
    "PONG",
    "Err",
    "Info",
    "Msg",
    "NatsProtocolError",
    "Ok",
    "Parser",
    "Ping",
    "Pong",
    "connect",
    "pub",
    "sub",
    "token_topic",
    "topic_token",
    "unsub",
    "valid_subject",
]

#: longest topic token kept readable; longer ones are hashed
MAX_TOKEN = 256
PING = b"PING\r\n"
PONG = b"PONG\r\n"
#: the NATS server's default max_control_line: a longer line is refused by the parser too
MAX_CONTROL_LINE = 4096
#: payloads above this are refused by the parser (the server's max_payload is 64 MiB at most)
MAX_PAYLOAD = 64 << 20

_SAFE = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/:@!~+=,;"
)
#: byte -> its form in a token
_ESCAPE = [bytes([b]) if b in _SAFE else b"%%%02X" % b for b in range(256)]
_HEX = frozenset(b"0123456789ABCDEF")


class NatsProtocolError(ValueError):
    """The server sent something that is not the NATS protocol; the connection is useless."""


# -- what a server sends -------------------------------------------------------------------


@frozen
class Info:
    """``INFO {...}``: the server's options (``max_payload``, ``tls_required``, ...)."""

    options: Mapping[str, Any]

    @property
    def max_payload(self) -> int:
        value = self.options.get("max_payload")
        return value if isinstance(value, int) and value > 0 else 1 << 20

    @property
    def tls_required(self) -> bool:
        return bool(self.options.get("tls_required"))

    @property
    def auth_required(self) -> bool:
        return bool(self.options.get("auth_required"))


class Msg(NamedTuple):
    """A message on ``subject`` for subscription ``sid``; ``reply`` is where an answer goes.
    ``headers`` is the raw header block of an ``HMSG`` (``None`` for ``MSG``). A named
    tuple, not attrs: one is made per message received, at a third of the cost."""

    subject: bytes
    sid: int
    reply: bytes | None
    payload: bytes
    headers: bytes | None = None


@frozen
class Ping:
    pass


@frozen
class Pong:
    pass


@frozen
class Ok:
    pass


@frozen
class Err:
    """``-ERR 'text'``: the server's complaint (some close the connection, some do not)."""

    text: str


Event = Info | Msg | Ping | Pong | Ok | Err
_PING, _PONG, _OK = Ping(), Pong(), Ok()


class Parser:
    """Feed it bytes as they come; it returns the complete events in them, and keeps the
    rest. Anything that is not the protocol raises :class:`NatsProtocolError` (and the
    parser must not be fed again)."""

    def __init__(self, max_control_line: int = MAX_CONTROL_LINE,
                 max_payload: int = MAX_PAYLOAD) -> None:
        self.max_control_line = max_control_line
        self.max_payload = max_payload
        self._buffer = b""

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Event]:
        buffer = self._buffer + data if self._buffer else data
        events: list[Event] = []
        at, size = 0, len(buffer)
        max_payload, new_tuple = self.max_payload, tuple.__new__
        while at < size:
            eol = buffer.find(b"\r\n", at, at + self.max_control_line + 2)
            if eol < 0:
                if size - at > self.max_control_line:
                    raise NatsProtocolError("control line too long")
                break
            if buffer.startswith(b"MSG ", at):  # most of what comes: its own fast path
                args = buffer[at + 4 : eol].split(b" ")
                if (
                    len(args) == 3
                    and args[1].isdigit()
                    and args[2].isdigit()
                    and int(args[2]) <= max_payload
                ):
                    start = eol + 2
                    end = start + int(args[2])
                    if end + 2 > size:
                        break
                    if buffer[end : end + 2] == b"\r\n":
                        # a Msg, made as the tuple it is (its __new__ costs twice this)
                        events.append(
                            new_tuple(Msg, (args[0], int(args[1]), None, buffer[start:end], None))
                        )
                        at = end + 2
                        continue
                    # else the general path below says what is wrong
            op = buffer[at : at + 4].upper()
            if op in (b"MSG ", b"HMSG"):
                parsed = self._message(buffer, at, eol, size, op == b"HMSG")
                if parsed is None:
                    break
                event, at = parsed
                events.append(event)
                continue
            events.append(self._line(buffer[at:eol]))
            at = eol + 2
        self._buffer = buffer[at:]
        return events

    def _message(
        self, buffer: bytes, at: int, eol: int, size: int, with_headers: bool
    ) -> tuple[Msg, int] | None:
        args = buffer[at + (5 if with_headers else 4) : eol].split()
        sizes = _message_sizes(args, with_headers)
        if sizes is None:
            raise NatsProtocolError(f"bad message line {buffer[at:eol][:80]!r}")
        sid, header_size, length = sizes
        if length > self.max_payload:
            raise NatsProtocolError(f"message of {length} bytes, above {self.max_payload}")
        start = eol + 2
        end = start + length
        if end + 2 > size:
            return None
        if buffer[end : end + 2] != b"\r\n":
            raise NatsProtocolError("message not followed by CRLF")
        reply = args[2] if len(args) == (5 if with_headers else 4) else None
        if with_headers:
            split = start + header_size
            msg = Msg(args[0], sid, reply, buffer[split:end], buffer[start:split])
        else:
            msg = Msg(args[0], sid, reply, buffer[start:end])
        return msg, end + 2

    @staticmethod
    def _line(line: bytes) -> Event:
        op, _, rest = line.partition(b" ")
        op = op.upper()
        if op == b"PING" and not rest.strip():
            return _PING
        if op == b"PONG" and not rest.strip():
            return _PONG
        if op == b"+OK" and not rest.strip():
            return _OK
        if op == b"-ERR":
            return Err(rest.strip().strip(b"'").decode("utf-8", "replace"))
        if op == b"INFO":
            try:
                options = json.loads(rest)
            except ValueError:
                raise NatsProtocolError("INFO is not JSON") from None
            if not isinstance(options, dict):
                raise NatsProtocolError("INFO is not a JSON object")
            return Info(options)
        raise NatsProtocolError(f"unknown operation {line[:40]!r}")


def _message_sizes(args: list[bytes], with_headers: bool) -> tuple[int, int, int] | None:
    """``(sid, header bytes, total bytes)`` of a MSG's or HMSG's arguments; None if bad."""
    if len(args) not in ((4, 5) if with_headers else (3, 4)):
        return None
    numbers = [args[1], *(args[-2:] if with_headers else args[-1:])]
    if not all(n.isdigit() and len(n) <= 12 for n in numbers):
        return None
    sid, *sizes = map(int, numbers)
    header_size, length = sizes if with_headers else (0, sizes[0])
    if header_size > length:
        return None
    return sid, header_size, length


# -- what a client writes ------------------------------------------------------------------


def connect(options: Mapping[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(dict(options), separators=(",", ":")).encode() + b"\r\n"


def pub(subject: bytes, payload: bytes, reply: bytes | None = None) -> bytes:
    if reply is None:
        return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)
    return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)


def sub(subject: bytes, sid: int) -> bytes:
    return b"SUB %s %d\r\n" % (subject, sid)


def unsub(sid: int) -> bytes:
    return b"UNSUB %d\r\n" % sid


def valid_subject(subject: bytes, wildcards: bool = False) -> bool:
    """Whether ``subject`` is a subject a server takes: non-empty tokens of printable
    non-space bytes; ``*`` and ``>`` (``>`` last) only with ``wildcards``."""
    if not subject or any(b <= 32 or b == 127 for b in subject):
        return False
    tokens = subject.split(b".")
    for index, token in enumerate(tokens):
        if not token:
            return False
        if token in (b"*", b">") and (
            not wildcards or (token == b">" and index != len(tokens) - 1)
        ):
            return False
    return True


# -- topics as subject tokens --------------------------------------------------------------


def topic_token(topic: str) -> bytes:
    """``topic`` as one subject token (see the module docstring)."""
    if not topic:
        return b"%"
    raw = topic.encode("utf-8", "surrogatepass")
    token = b"".join([_ESCAPE[b] for b in raw])
    if len(token) > MAX_TOKEN:
        return b"#" + hashlib.sha256(raw).hexdigest().encode("ascii")
    return token


def token_topic(token: bytes) -> str | None:
    """The topic ``token`` stands for; ``None`` for a hashed one (``#...``). ValueError for
    a token :func:`topic_token` never makes."""
    if token == b"%":
        return ""
    if token.startswith(b"#") and len(token) == 65:
        return None
    out = bytearray()
    at, size = 0, len(token)
    if not size:
        raise ValueError("empty token")
    while at < size:
        b = token[at]
        if b == 0x25:  # %
            pair = token[at + 1 : at + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise ValueError(f"bad escape in {token[:40]!r}")
            value = int(pair, 16)
            if value in _SAFE:
                raise ValueError(f"needless escape in {token[:40]!r}")
            out.append(value)
            at += 3
        elif b in _SAFE:
            out.append(b)
            at += 1
        else:
            raise ValueError(f"byte {b} in token {token[:40]!r}")
    if len(token) > MAX_TOKEN:
        raise ValueError("token too long")
    return out.decode("utf-8", "surrogatepass")
