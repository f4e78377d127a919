"""SSMP 1.1 codec, sans-IO: bytes in, frozen events out; values in, bytes out.

Server side: :class:`RequestDecoder` turns the client's bytes into request events and
raises :class:`~msgbroker.errors.RemoteProtocolError` at the first byte that breaks the
grammar (the server then answers ``400`` and closes). Events parsed before the bad byte are
yielded first, so nothing already accepted is lost. Client side: :class:`ReplyDecoder`
turns the server's bytes into replies and events.

Limits (DECISIONS.md): verb 1..16 upper-case letters, id 1..64 ID characters, text payload
1..1024 bytes, binary payload = 2-byte big-endian (length - 1) then 1..1024 bytes; a binary
payload may contain LF.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from msgbroker.errors import RemoteProtocolError

from .grammar import (
    _ID_RE,
    _VERB_RE,
    MAX_ID,
    MAX_MESSAGE,
    MAX_PAYLOAD,
    MAX_VERB,
    IdCache,
    _payload_end,
    encode_payload,
    is_valid_id,
)
from .replies import (
    Delivery,
    Presence,
    Reply,
    ReplyDecoder,
    ServerMessage,
    ServerPing,
    ServerPong,
)
from .requests import (
    CLOSE,
    PING,
    PONG,
    Bcast,
    Close,
    Login,
    Mcast,
    McastBlock,
    McastRun,
    Ping,
    Pong,
    Request,
    Subscribe,
    Ucast,
    UnknownVerb,
    Unsubscribe,
    expand_runs,
)

#: text MCASTs, each to another topic than the one before it (group 1: a topic): a block
#: ends before an MCAST to the topic of the one before it, which starts a run instead
_MCAST_BLOCK = re.compile(
    rb"(?:MCAST ([A-Za-z0-9.:@/_\-+=~]{1,64}) [^\x00-\x03\n][^\n]{0,1023}\n(?!MCAST \1 ))+"
)
#: the topic of each line of a block (each match takes a whole line: the next starts where
#: it ends, so text in a payload is never taken for a topic; "^" with MULTILINE would try
#: every byte and cost 2.5 times as much)
_BLOCK_TOPICS = re.compile(rb"MCAST ([^ \n]+) [^\n]*\n")
#: text MCASTs to one topic, one after the other (group 1: the first; group 2: the topic)
_MCAST_RUN = re.compile(
    rb"(MCAST ([A-Za-z0-9.:@/_\-+=~]{1,64}) [^\x00-\x03\n][^\n]{0,1023}\n)"
    rb"(?:MCAST \2 [^\x00-\x03\n][^\n]{0,1023}\n)*"
)

# -- server side: requests ------------------------------------------------------------------


#: validated ids shared by every :class:`RequestDecoder` (bounded: cleared when full)
_IDS = IdCache()


class RequestDecoder:
    """Incremental parser of client requests."""

    def __init__(self) -> None:
        self._buf = b""
        # one cache for every connection: topics repeat across connections too, and a
        # cache per connection cost about 400 bytes each
        self._ids = _IDS

    def feed(self, data: bytes) -> Iterator[Request]:
        """Yield the complete requests in ``data`` (plus what was buffered).

        Consecutive text-payload MCASTs to one topic come out as one :class:`McastRun`,
        and those each to another topic than the one before it as one :class:`McastBlock`
        (each validated by one regular-expression match over all of them). Raises
        :class:`RemoteProtocolError` at the first grammar violation, after yielding every
        request before it.
        """
        buf = self._buf + data if self._buf else data
        pos = 0
        size = len(buf)
        parse = self._parse
        while pos < size:
            if buf.startswith(b"MCAST ", pos):
                run = self._mcast_run(buf, pos)
                if run is not None:
                    yield run[0]
                    pos = run[1]
                    continue
            nl = buf.find(b"\n", pos)
            result = parse(buf, pos, nl)
            if result is None:
                break
            event, pos = result
            yield event
        rest = buf[pos:]
        if len(rest) > MAX_MESSAGE:
            self._buf = b""
            raise RemoteProtocolError("message too long")
        self._buf = rest

    def _parse(self, buf: bytes, pos: int, nl: int) -> tuple[Request, int] | None:
        """One request at ``pos``: (event, position after its LF), or None for more data.

        Every message ends with LF, so without one nothing is complete yet. ``nl`` may lie
        inside a binary payload (which can contain LF); the payload's length decides.
        """
        if nl < 0:
            _check_partial_request(buf, pos)
            return self._need_more(buf, pos)
        sp = buf.find(b" ", pos, nl)
        verb = buf[pos : sp if sp >= 0 else nl]
        if verb == b"MCAST":  # the hot path, inline
            if sp < 0:
                raise RemoteProtocolError("MCAST needs a topic and a payload")
            sp2 = buf.find(b" ", sp + 1, nl)
            if sp2 < 0:
                raise RemoteProtocolError("MCAST needs a topic and a payload")
            topic = self._ids.get(buf[sp + 1 : sp2], "topic")
            parsed = _payload_end(buf, sp2 + 1, nl)
            if parsed is None:
                return self._need_more(buf, pos)
            stop, payload = parsed
            return Mcast(topic, payload, buf[pos:stop]), stop + 1
        handler = _HANDLERS.get(verb)
        if handler is not None:
            return handler(self, buf, pos, sp, nl)
        if _VERB_RE.fullmatch(verb) is None:
            raise RemoteProtocolError(f"bad verb {verb[:20]!r}")
        return self._compat(buf, pos, sp, nl)

    def _mcast_run(self, buf: bytes, pos: int) -> tuple[Request, int] | None:
        """A run of valid text MCASTs to one topic at ``pos`` (a single one comes out as
        :class:`Mcast`), or None: then the general parser handles what is there, errors
        included. One fixed pattern with a back-reference: nothing is compiled per topic, so
        a client spraying topics costs no more than one sending to a few."""
        match = _MCAST_RUN.match(buf, pos)
        if match is None:
            return None
        end = match.end()
        topic = self._ids.get(match.group(2), "topic")
        if match.end(1) == end:  # only the first line matched: the next is to another topic
            block = _MCAST_BLOCK.match(buf, pos)
            if block is not None and block.end() > end:
                stop = block.end()
                text = buf[pos:stop]
                topics = self._ids.get_all(_BLOCK_TOPICS.findall(text), "topic")
                return McastBlock(text, topics, len(topics)), stop
            return Mcast(topic, buf[match.end(2) + 1 : end - 1], buf[pos : end - 1]), end
        return McastRun(topic, buf[pos:end], buf.count(b"\n", pos, end)), end

    @staticmethod
    def _need_more(buf: bytes, pos: int) -> None:
        if len(buf) - pos > MAX_MESSAGE:
            raise RemoteProtocolError("message too long")

    def _bare(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int]:
        if sp >= 0:
            raise RemoteProtocolError("unexpected argument")
        return _BARE[buf[pos:nl]], nl + 1

    def _login(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int] | None:
        if sp < 0:
            raise RemoteProtocolError("LOGIN needs an identifier and a scheme")
        sp2 = buf.find(b" ", sp + 1, nl)
        if sp2 < 0:
            raise RemoteProtocolError("LOGIN needs an identifier and a scheme")
        identity = self._ids.get(buf[sp + 1 : sp2], "identifier")
        sp3 = buf.find(b" ", sp2 + 1, nl)
        if sp3 < 0:
            scheme = self._ids.get(buf[sp2 + 1 : nl], "scheme")
            return Login(identity, scheme, None), nl + 1
        scheme = self._ids.get(buf[sp2 + 1 : sp3], "scheme")
        parsed = _payload_end(buf, sp3 + 1, nl)
        if parsed is None:
            return self._need_more(buf, pos)
        stop, credential = parsed
        return Login(identity, scheme, credential), stop + 1

    def _subscribe(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int]:
        if sp < 0:
            raise RemoteProtocolError("SUBSCRIBE needs a topic")
        sp2 = buf.find(b" ", sp + 1, nl)
        if sp2 < 0:
            return Subscribe(self._ids.get(buf[sp + 1 : nl], "topic"), False), nl + 1
        topic = self._ids.get(buf[sp + 1 : sp2], "topic")
        if buf[sp2 + 1 : nl] != b"PRESENCE":
            raise RemoteProtocolError("SUBSCRIBE option must be PRESENCE")
        return Subscribe(topic, True), nl + 1

    def _unsubscribe(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int]:
        if sp < 0:
            raise RemoteProtocolError("UNSUBSCRIBE needs a topic")
        return Unsubscribe(self._ids.get(buf[sp + 1 : nl], "topic")), nl + 1

    def _ucast(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int] | None:
        if sp < 0:
            raise RemoteProtocolError("UCAST needs a target and a payload")
        sp2 = buf.find(b" ", sp + 1, nl)
        if sp2 < 0:
            raise RemoteProtocolError("UCAST needs a target and a payload")
        target = self._ids.get(buf[sp + 1 : sp2], "target")
        parsed = _payload_end(buf, sp2 + 1, nl)
        if parsed is None:
            return self._need_more(buf, pos)
        stop, payload = parsed
        return Ucast(target, payload, buf[pos:stop]), stop + 1

    def _bcast(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int] | None:
        if sp < 0:
            raise RemoteProtocolError("BCAST needs a payload")
        parsed = _payload_end(buf, sp + 1, nl)
        if parsed is None:
            return self._need_more(buf, pos)
        stop, payload = parsed
        return Bcast(payload, buf[pos:stop]), stop + 1

    def _compat(self, buf: bytes, pos: int, sp: int, nl: int) -> tuple[Request, int] | None:
        """``verb [SP id] [SP payload]`` with an unknown verb: 501 if well-formed."""
        verb = buf[pos : sp if sp >= 0 else nl].decode("ascii")
        if sp < 0:  # nothing after the verb
            return UnknownVerb(verb), nl + 1
        start = sp + 1
        if buf[start] > 3:
            sp2 = buf.find(b" ", start, nl)
            token = buf[start : sp2 if sp2 >= 0 else nl]
            if _ID_RE.fullmatch(token) is not None:
                if sp2 < 0:
                    return UnknownVerb(verb), nl + 1
                # ``verb SP id SP payload``, or else ``verb SP payload`` where the text
                # payload merely starts like an id (``FOO x `` has payload ``"x "``).
                try:
                    parsed = _payload_end(buf, sp2 + 1, nl)
                except RemoteProtocolError:
                    parsed = _payload_end(buf, start, nl)
                if parsed is None:
                    return self._need_more(buf, pos)
                return UnknownVerb(verb), parsed[0] + 1
        parsed = _payload_end(buf, start, nl)
        if parsed is None:
            return self._need_more(buf, pos)
        return UnknownVerb(verb), parsed[0] + 1


_PARTIAL_VERB_RE = re.compile(rb"[A-Z]{0,16}\Z|([A-Z]{1,16}) ")
_PARTIAL_BINARY_RE = re.compile(
    rb"(?:(?:MCAST|UCAST) %s |BCAST |LOGIN %s %s )[\x00-\x03]" % ((_ID_RE.pattern,) * 3)
)


def _check_partial_request(buf: bytes, pos: int) -> None:
    """``buf[pos:]`` is a request without its LF (there is no LF in it). Raise now if no
    continuation can make it valid, so that the client gets its ``400`` at once rather
    than when (if ever) an LF comes: a bad verb, an argument after PING/PONG/CLOSE, or a
    binary payload of a known verb whose length has passed without the LF after it. Runs
    once per feed at most, never per complete message."""
    verb = _PARTIAL_VERB_RE.match(buf, pos, pos + MAX_VERB + 1)
    if verb is None:
        raise RemoteProtocolError(f"bad verb {buf[pos : pos + 20]!r}")
    if verb[1] is not None and verb[1] in _BARE:
        raise RemoteProtocolError("unexpected argument")
    binary = _PARTIAL_BINARY_RE.match(buf, pos)
    if binary is not None:
        start = binary.end() - 1
        if start + 2 <= len(buf) and start + 3 + int.from_bytes(buf[start : start + 2]) < len(buf):
            raise RemoteProtocolError("binary payload not followed by LF")


_BARE: dict[bytes, Request] = {b"PING": PING, b"PONG": PONG, b"CLOSE": CLOSE}
_HANDLERS = {
    b"LOGIN": RequestDecoder._login,
    b"SUBSCRIBE": RequestDecoder._subscribe,
    b"UNSUBSCRIBE": RequestDecoder._unsubscribe,
    b"UCAST": RequestDecoder._ucast,
    b"BCAST": RequestDecoder._bcast,
    b"PING": RequestDecoder._bare,
    b"PONG": RequestDecoder._bare,
    b"CLOSE": RequestDecoder._bare,
}

# -- encoders -------------------------------------------------------------------------------


def encode_reply(code: int, payload: bytes | None = None) -> bytes:
    """``code [SP payload] LF`` (``payload`` is raw data; binary-framed when needed)."""
    if not 0 <= code <= 999:
        raise ValueError(f"reply code must have 3 digits: {code}")
    if payload is None:
        return b"%03d\n" % code
    wire = encode_payload(payload)
    if wire is None:
        raise ValueError("payload cannot be carried by SSMP")
    return b"%03d %s\n" % (code, wire)


def _request(verb: bytes, *ids: str, payload: bytes | None = None) -> bytes:
    parts = [verb]
    for value in ids:
        if not is_valid_id(value):
            raise ValueError(f"not a valid SSMP id: {value!r}")
        parts.append(value.encode("ascii"))
    if payload is not None:
        wire = encode_payload(payload)
        if wire is None:
            raise ValueError("payload must be 1..1024 bytes")
        parts.append(wire)
    return b" ".join(parts) + b"\n"


def login(identity: str, scheme: str, credential: bytes | None = None) -> bytes:
    return _request(b"LOGIN", identity, scheme, payload=credential)


def subscribe(topic: str, presence: bool = False) -> bytes:
    frame = _request(b"SUBSCRIBE", topic)
    return frame[:-1] + b" PRESENCE\n" if presence else frame


def unsubscribe(topic: str) -> bytes:
    return _request(b"UNSUBSCRIBE", topic)


def mcast(topic: str, payload: bytes) -> bytes:
    return _request(b"MCAST", topic, payload=payload)


def ucast(target: str, payload: bytes) -> bytes:
    return _request(b"UCAST", target, payload=payload)


def bcast(payload: bytes) -> bytes:
    return _request(b"BCAST", payload=payload)


def ping() -> bytes:
    return b"PING\n"


def pong() -> bytes:
    return b"PONG\n"


def close() -> bytes:
    return b"CLOSE\n"


#: the facade: the requests' codec (here) and what it re-exports from .grammar, .replies
#: and .requests
__all__ = [
    "CLOSE",
    "MAX_ID",
    "MAX_MESSAGE",
    "MAX_PAYLOAD",
    "MAX_VERB",
    "PING",
    "PONG",
    "Bcast",
    "Close",
    "Delivery",
    "IdCache",
    "Login",
    "Mcast",
    "McastBlock",
    "McastRun",
    "Ping",
    "Pong",
    "Presence",
    "Reply",
    "ReplyDecoder",
    "Request",
    "ServerMessage",
    "ServerPing",
    "ServerPong",
    "Subscribe",
    "Ucast",
    "UnknownVerb",
    "Unsubscribe",
    "encode_payload",
    "expand_runs",
    "is_valid_id",
]
