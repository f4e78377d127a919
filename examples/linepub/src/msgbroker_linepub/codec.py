"""The linepub wire format, sans-IO: bytes in, frozen events out.

One request or event per line, ``\\n``-terminated, ASCII words separated by one space; the
last field of ``PUB`` and ``MSG`` is the rest of the line (UTF-8 text, may hold spaces).

Client to broker::

    HELLO <identity> <scheme> [<credential>]
    SUB <topic>          UNSUB <topic>
    PUB <topic> <text>   PING   BYE

Broker to client: ``OK``, ``NO <reason>`` (the request failed; the connection stays),
``ERR <why>`` (the client broke the protocol; the connection closes), ``PONG``,
``PING`` (the broker's keepalive: answer it with a ``PING`` request),
``MOTD <text>``, and deliveries ``MSG <topic> <sender> <text>``.
"""

from __future__ import annotations

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

#: the longest line either side may send (bytes, without the newline)
MAX_LINE = 4096


@frozen
class Hello:
    identity: str
    scheme: str
    credential: bytes | None


@frozen
class Sub:
    topic: str


@frozen
class Unsub:
    topic: str


@frozen
class Pub:
    topic: str
    text: str


@frozen
class Ping:
    pass


@frozen
class Bye:
    pass


Request = Hello | Sub | Unsub | Pub | Ping | Bye


def _word(value: bytes, what: str) -> str:
    if not value or not all(0x21 <= b <= 0x7E for b in value):
        raise RemoteProtocolError(f"bad {what}")
    return value.decode("ascii")


def parse_request(line: bytes) -> Request:
    """One request line (without its newline)."""
    verb, _, rest = line.partition(b" ")
    if verb == b"PUB":
        topic, sep, text = rest.partition(b" ")
        if not sep:
            raise RemoteProtocolError("PUB needs a topic and a text")
        try:
            return Pub(_word(topic, "topic"), text.decode("utf-8"))
        except UnicodeDecodeError:
            raise RemoteProtocolError("text is not UTF-8") from None
    words = rest.split(b" ") if rest else []
    if verb == b"HELLO" and len(words) in (2, 3):
        credential = words[2] if len(words) == 3 else None
        return Hello(_word(words[0], "identity"), _word(words[1], "scheme"), credential)
    if verb in (b"SUB", b"UNSUB") and len(words) == 1:
        topic = _word(words[0], "topic")
        return Sub(topic) if verb == b"SUB" else Unsub(topic)
    if verb == b"PING" and not words:
        return Ping()
    if verb == b"BYE" and not words:
        return Bye()
    raise RemoteProtocolError(f"bad request {verb[:16]!r}")


class LineDecoder:
    """Splits a byte stream into requests, whatever the chunks."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buffer = b""
        self._max_line = max_line

    def feed(self, data: bytes) -> list[Request]:
        buffer = self._buffer + data
        *lines, rest = buffer.split(b"\n")
        if len(rest) > self._max_line:
            raise RemoteProtocolError(f"line over {self._max_line} bytes")
        self._buffer = rest
        requests = []
        for line in lines:
            if len(line) > self._max_line:
                raise RemoteProtocolError(f"line over {self._max_line} bytes")
            requests.append(parse_request(line.removesuffix(b"\r")))
        return requests


def encode_request(request: Request) -> bytes:
    """A request as the client writes it."""
    if isinstance(request, Hello):
        credential = b"" if request.credential is None else b" " + request.credential
        return b"HELLO %s %s%s\n" % (request.identity.encode(), request.scheme.encode(), credential)
    if isinstance(request, Pub):
        return b"PUB %s %s\n" % (request.topic.encode(), request.text.encode("utf-8"))
    if isinstance(request, Sub | Unsub):
        verb = b"SUB" if isinstance(request, Sub) else b"UNSUB"
        return b"%s %s\n" % (verb, request.topic.encode())
    return b"PING\n" if isinstance(request, Ping) else b"BYE\n"


def encode_delivery(topic: str, sender: str, text: str) -> bytes | None:
    """``MSG`` for a delivery, or None when linepub cannot carry it (a topic or sender that
    is not one word, text that is not UTF-8 or holds a newline)."""
    if not _is_word(topic) or not _is_word(sender) or "\n" in text:
        return None
    return f"MSG {topic} {sender} {text}\n".encode()


def _is_word(value: str) -> bool:
    return bool(value) and value.isascii() and all(0x21 <= ord(c) <= 0x7E for c in value)


@frozen
class Reply:
    """A line from the broker, as the client reads it."""

    kind: str  # OK, NO, ERR, PONG, PING, MOTD, MSG
    fields: tuple[str, ...]


def parse_reply(line: bytes) -> Reply:
    text = line.decode("utf-8")
    kind, _, rest = text.partition(" ")
    if kind == "MSG":
        topic, sender, body = ([*rest.split(" ", 2), "", ""])[:3]
        return Reply(kind, (topic, sender, body))
    if kind in ("OK", "PONG", "PING"):
        return Reply(kind, ())
    if kind in ("NO", "ERR", "MOTD"):
        return Reply(kind, (rest,))
    raise RemoteProtocolError(f"unknown reply {kind[:16]!r}")
