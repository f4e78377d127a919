"""One connection to Redis, on Twisted: commands out (pipelined, written in one go by
:meth:`RedisConnection.flush`), replies and pub/sub messages in, read by hiredis (the Redis
project's C parser) in RESP3, so one connection both subscribes and runs commands, in
order: a SUBSCRIBE written before a PUBLISH is in effect when the PUBLISH is seen.

The connection is the transport's streaming producer: when Twisted's buffer is full
(Redis does not keep up) what would be written is held here, within ``max_buffer`` bytes;
past that :meth:`write` refuses and the caller counts what it dropped. Nothing blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from msgbroker.connection import no_delay
from msgbroker.engineoutput import EngineOutput

#: pub/sub commands answer with push messages, not replies
_NO_REPLY = frozenset({b"SUBSCRIBE", b"UNSUBSCRIBE"})


class RedisError(Exception):
    """Redis answered with an error, or the connection was lost before it answered."""


def pack(*args: bytes | str | int) -> bytes:
    return hiredis.pack_command(args)  # type: ignore[arg-type]


@implementer(IPushProducer)
class RedisConnection(Protocol):
    """See the module docstring. ``on_push(message)`` gets each pub/sub message (a list),
    ``on_chunk()`` is called after each read, ``on_lost(reason)`` once at the end."""

    transport: Any  # a TCP or TLS transport

    def __init__(
        self,
        max_buffer: int,
        on_push: Callable[[list[Any]], None],
        on_chunk: Callable[[], None],
        on_lost: Callable[[str], None],
        on_error: Callable[[str], None],
    ) -> None:
        self.max_buffer = max_buffer
        self.on_push = on_push
        self.on_chunk = on_chunk
        self.on_lost = on_lost
        self.on_error = on_error
        self.reader = hiredis.Reader()
        #: one entry per command awaiting its reply: a Deferred, or None (not awaited)
        self._pending: deque[Deferred[Any] | None] = deque()
        self.output = EngineOutput(max_buffer)
        self.lost = False
        self.made: Deferred[RedisConnection] = Deferred()

    # -- commands --------------------------------------------------------------------------

    def command(self, *args: bytes | str | int) -> Deferred[Any]:
        """Send a command (written at the next :meth:`flush`); its reply, or RedisError."""
        d: Deferred[Any] = Deferred()
        if self.lost:
            d.errback(RedisError("not connected"))
            return d
        self.output.queue(pack(*args))
        self._pending.append(d)
        return d

    def send(self, commands: Sequence[Sequence[bytes | str | int]], force: bool = False) -> bool:
        """Queue commands whose replies nobody awaits (an error reply is logged). False, and
        nothing queued, when the connection is gone or ``max_buffer`` bytes already wait
        (``force``: queue anyway, for the node's own state)."""
        if self.lost:
            return False
        packed = [pack(*args) for args in commands]
        if not self.output.fits(sum(map(len, packed)), force):
            return False
        self.output.queue_all(packed)
        for args in commands:
            if args[0] not in _NO_REPLY:  # command names are upper-case bytes here
                self._pending.append(None)
        return True

    def flush(self) -> None:
        """Write what was queued, in one write (held instead while Redis does not read)."""
        if not self.lost:
            self.output.flush()

    @property
    def buffered(self) -> int:
        return self.output.buffered

    # -- Twisted ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        # small writes (a heartbeat, a lone message) go at once, not after Redis's delayed
        # ACK of the previous one (through TLS too: the TCP socket under it)
        no_delay(self.transport)
        self.output.write = self.transport.write
        self.transport.registerProducer(self, True)
        self.made.callback(self)

    def dataReceived(self, data: bytes) -> None:
        reader = self.reader
        try:
            reader.feed(data)
            while True:
                reply = reader.gets()
                if reply is False:
                    break
                if isinstance(reply, hiredis.PushNotification):
                    self.on_push(reply)
                    continue
                waiting = self._pending.popleft() if self._pending else None
                if waiting is not None:
                    if isinstance(reply, hiredis.ReplyError):
                        waiting.errback(RedisError(str(reply)))
                    else:
                        waiting.callback(reply)
                elif isinstance(reply, hiredis.ReplyError):
                    self.on_error(str(reply))
        except hiredis.ProtocolError as e:
            self.on_error(f"unreadable reply from Redis: {e}")
            self.transport.abortConnection()
            return
        self.on_chunk()

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:  # noqa: B008
        self.lost = True
        pending, self._pending = self._pending, deque()
        for d in pending:
            if d is not None:
                d.errback(RedisError("connection lost"))
        self.output.clear()
        self.on_lost(reason.getErrorMessage())

    def pauseProducing(self) -> None:
        self.output.pause()

    def resumeProducing(self) -> None:
        self.output.resume()

    def stopProducing(self) -> None:
        """Nothing to stop: :meth:`connectionLost` follows when the connection ends (TLS
        calls this as its handshake begins)."""
