"""SSMP 1.1: the requests a server receives, as frozen events (the decoder is in
:mod:`.codec`, which re-exports these)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from operator import itemgetter

from attrs import frozen

_LINES = re.compile(rb"[^\n]*\n")

# -- events a server receives ---------------------------------------------------------------


@frozen(slots=True)
class Login:
    identity: str
    scheme: str
    credential: bytes | None


@frozen(slots=True)
class Subscribe:
    topic: str
    presence: bool


@frozen(slots=True)
class Unsubscribe:
    topic: str


@frozen(slots=True)
class Mcast:
    """``line`` is the request as received, without LF: a server forwards
    ``000 <from> `` + ``line`` unchanged, so the payload is never re-encoded."""

    topic: str
    payload: bytes
    line: bytes


@frozen(slots=True)
class McastRun:
    """``count`` (2 or more) consecutive text-payload MCASTs to one topic, exactly as
    received: ``block`` is the requests with their LFs. A client pipelining publishes
    sends these; routing them as one run keeps the per-message cost to a few C-level
    byte operations (see :meth:`RequestDecoder.feed`)."""

    topic: str
    block: bytes
    count: int

    def payloads(self) -> list[bytes]:
        skip = len(b"MCAST  ") + len(self.topic)
        # line[skip:] for each line, by C iterators (a run can be thousands of lines)
        return list(map(itemgetter(slice(skip, None)), self.block.split(b"\n")[:-1]))

    def payload_bytes(self) -> int:
        """The payloads' total size, from the block's length: no line is split."""
        return len(self.block) - self.count * (len(b"MCAST  \n") + len(self.topic))

    def expand(self) -> list[Mcast]:
        """The run as the individual :class:`Mcast` events it stands for."""
        skip = len(b"MCAST  ") + len(self.topic)
        return [Mcast(self.topic, line[skip:], line) for line in self.block.split(b"\n")[:-1]]


@frozen(slots=True)
class McastBlock:
    """``count`` (2 or more) consecutive text-payload MCASTs, each to another topic than
    the one before it (a publisher moving from topic to topic), exactly as received:
    ``block`` is the requests with their LFs, ``topics`` their topics in order. Validated
    by one regular-expression match over all of them, like :class:`McastRun`."""

    block: bytes
    topics: list[str]
    count: int

    def payloads(self) -> list[bytes]:
        return [
            line[len(b"MCAST  ") + len(topic) :]
            for topic, line in zip(self.topics, self.block.split(b"\n"), strict=False)
        ]

    def prefixed(self, prefix: bytes) -> list[bytes]:
        """Each request line with ``prefix`` before it (and its LF): by C calls."""
        block = self.block
        text = prefix + block.replace(b"\n", b"\n" + prefix)
        if b"\r" in block:  # splitlines would split there too
            return _LINES.findall(text)
        return text.splitlines(keepends=True)[:-1]  # the last is the trailing prefix

    def expand(self) -> list[Mcast]:
        """The block as the individual :class:`Mcast` events it stands for."""
        return [
            Mcast(topic, line[len(b"MCAST  ") + len(topic) :], line)
            for topic, line in zip(self.topics, self.block.split(b"\n"), strict=False)
        ]


def expand_runs(events: Iterable[Request]) -> list[Request]:
    """``events`` with every :class:`McastRun` and :class:`McastBlock` replaced by its
    :class:`Mcast` events.

    How requests group into runs depends on how the bytes were chunked; the requests
    themselves do not. Compare expanded streams when chunking differs.
    """
    out: list[Request] = []
    for event in events:
        if type(event) is McastRun or type(event) is McastBlock:
            out.extend(event.expand())
        else:
            out.append(event)
    return out


@frozen(slots=True)
class Ucast:
    target: str
    payload: bytes
    line: bytes


@frozen(slots=True)
class Bcast:
    payload: bytes
    line: bytes


@frozen(slots=True)
class Ping:
    pass


@frozen(slots=True)
class Pong:
    pass


@frozen(slots=True)
class Close:
    pass


@frozen(slots=True)
class UnknownVerb:
    """A well-formed request with a verb this version does not know (answer ``501``)."""

    verb: str


Request = (
    Login
    | Subscribe
    | Unsubscribe
    | Mcast
    | McastRun
    | McastBlock
    | Ucast
    | Bcast
    | Ping
    | Pong
    | Close
    | UnknownVerb
)

PING = Ping()
PONG = Pong()
CLOSE = Close()
