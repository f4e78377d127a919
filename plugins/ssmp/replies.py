"""SSMP 1.1 codec, client side (sans-IO): what a server sends — replies and ``000`` events.

Split from :mod:`codec` (which re-exports everything here) to keep modules small; the
helpers (id cache, payload framing, limits) are the codec's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

from .grammar import MAX_MESSAGE, IdCache, _payload_end

# -- events a client receives ---------------------------------------------------------------


@frozen(slots=True)
class Reply:
    """A response: ``code`` (200, 400, 401, 404, 405, 409, 501) and optional payload."""

    code: int
    payload: bytes | None


@frozen(slots=True)
class Delivery:
    """A forwarded MCAST/UCAST/BCAST: ``kind`` is the verb, ``to`` the topic or the target
    identity (``None`` for BCAST)."""

    sender: str
    kind: str
    to: str | None
    payload: bytes


@frozen(slots=True)
class Presence:
    """``000 <sender> SUBSCRIBE|UNSUBSCRIBE <topic> [PRESENCE]``."""

    sender: str
    topic: str
    subscribed: bool
    presence: bool


@frozen(slots=True)
class ServerPing:
    sender: str


@frozen(slots=True)
class ServerPong:
    sender: str


ServerMessage = Reply | Delivery | Presence | ServerPing | ServerPong


# -- client side: replies and events --------------------------------------------------------


_PARTIAL_CODE_RE = re.compile(rb"[0-9]{0,3}\Z|[0-9]{3} ")


class ReplyDecoder:
    """Incremental parser of what a server sends: replies and ``000`` events.

    Raises :class:`RemoteProtocolError` for anything outside the grammar, including an
    event with an unknown verb (a client must then close the connection).
    """

    def __init__(self) -> None:
        self._buf = b""
        self._ids = IdCache()

    def feed(self, data: bytes) -> Iterator[ServerMessage]:
        buf = self._buf + data if self._buf else data
        pos = 0
        while pos < len(buf):
            nl = buf.find(b"\n", pos)
            result = self._parse(buf, pos, nl)
            if result is None:
                break
            event, pos = result
            yield event
        rest = buf[pos:]
        if len(rest) > MAX_MESSAGE + 70:
            self._buf = b""
            raise RemoteProtocolError("message too long")
        self._buf = rest

    def _parse(self, buf: bytes, pos: int, nl: int) -> tuple[ServerMessage, int] | None:
        if nl < 0:  # incomplete: fail now if the code already cannot be valid
            if _PARTIAL_CODE_RE.match(buf, pos, pos + 4) is None:
                raise RemoteProtocolError(f"bad response code {buf[pos : pos + 4]!r}")
            return None
        code_bytes = buf[pos : pos + 3]
        if len(code_bytes) < 3 or not code_bytes.isdigit():
            raise RemoteProtocolError(f"bad response code {code_bytes!r}")
        after = pos + 3
        if code_bytes != b"000":
            if nl == after:
                return Reply(int(code_bytes), None), nl + 1
            if buf[after] != 0x20:
                raise RemoteProtocolError("response code not followed by SP or LF")
            parsed = _payload_end(buf, after + 1, nl)
            if parsed is None:
                return None
            stop, payload = parsed
            return Reply(int(code_bytes), payload), stop + 1
        return self._event(buf, pos, after, nl)

    def _event(self, buf: bytes, pos: int, after: int, nl: int) -> tuple[ServerMessage, int] | None:
        end = nl
        if buf[after] != 0x20:
            raise RemoteProtocolError("000 not followed by SP")
        sp1 = buf.find(b" ", after + 1, end)
        if sp1 < 0:
            raise RemoteProtocolError("event without a verb")
        sender = self._ids.get(buf[after + 1 : sp1], "sender")
        sp2 = buf.find(b" ", sp1 + 1, end)
        verb = buf[sp1 + 1 : sp2 if sp2 >= 0 else end]
        if verb in (b"PING", b"PONG"):
            if sp2 >= 0:
                raise RemoteProtocolError(f"{verb!r} event with arguments")
            return (ServerPing(sender) if verb == b"PING" else ServerPong(sender)), nl + 1
        if verb in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
            if sp2 < 0:
                raise RemoteProtocolError("presence event without a topic")
            sp3 = buf.find(b" ", sp2 + 1, nl)
            topic = self._ids.get(buf[sp2 + 1 : sp3 if sp3 >= 0 else nl], "topic")
            presence = False
            if sp3 >= 0:
                if verb != b"SUBSCRIBE" or buf[sp3 + 1 : nl] != b"PRESENCE":
                    raise RemoteProtocolError("bad presence event option")
                presence = True
            return Presence(sender, topic, verb == b"SUBSCRIBE", presence), nl + 1
        if verb in (b"MCAST", b"UCAST"):
            if sp2 < 0:
                raise RemoteProtocolError(f"{verb!r} event without a payload")
            sp3 = buf.find(b" ", sp2 + 1, end)
            if sp3 < 0:
                raise RemoteProtocolError(f"{verb!r} event without a payload")
            to = self._ids.get(buf[sp2 + 1 : sp3], "topic")
            parsed = _payload_end(buf, sp3 + 1, nl)
            if parsed is None:
                return None
            stop, payload = parsed
            return Delivery(sender, verb.decode(), to, payload), stop + 1
        if verb == b"BCAST":
            if sp2 < 0:
                raise RemoteProtocolError("BCAST event without a payload")
            parsed = _payload_end(buf, sp2 + 1, nl)
            if parsed is None:
                return None
            stop, payload = parsed
            return Delivery(sender, "BCAST", None, payload), stop + 1
        raise RemoteProtocolError(f"event with unknown verb {verb[:20]!r}")
