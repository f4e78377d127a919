"""One connection to a NATS server, on Twisted: the thin layer over the sans-IO
:mod:`.codec`. The server speaks first (``INFO``); the connection then upgrades to TLS when
asked to (or when the server requires it), writes ``CONNECT`` and a ``PING``, and is ready
at the ``PONG`` (an ``-ERR`` before it is the server's refusal, e.g. a wrong password).

The upgrade wraps the TCP connection in Twisted's TLS protocol on the engine's own reactor
(``transport.startTLS`` would time the TLS layer's writes on the global reactor, which is
not always the one running).

Output is queued and written in one go by :meth:`NatsConnection.flush`. The connection is
the transport's streaming producer: when Twisted's buffer is full (the server does not keep
up) what would be written is held here, within ``max_buffer`` bytes; past that
:meth:`write` refuses and the caller counts what it dropped. Nothing blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from msgbroker.connection import no_delay
from msgbroker.engineoutput import EngineOutput

from . import codec


class NatsError(Exception):
    """The connection was lost before the server answered, or is not there."""


@implementer(IPushProducer)
class NatsConnection(Protocol):
    """See the module docstring. ``connect_options()`` gives CONNECT's fields (name, user,
    password or token: asked for only when the server's INFO has come, and never kept);
    ``tls(required)`` the client TLS options to upgrade with, or ``None`` for plain TCP
    (``required``: the server's INFO says it takes TLS only). ``on_msg(msg)`` gets each
    message, ``on_chunk()`` is called after each read, ``on_ready(info)`` once connected,
    ``on_lost(reason)`` once at the end, ``on_error(text, ready)`` for each ``-ERR``."""

    transport: Any  # a TCP transport

    def __init__(
        self,
        clock: Any,
        max_buffer: int,
        connect_options: Callable[[], dict[str, Any]],
        tls: Callable[[bool], Any],
        on_ready: Callable[[codec.Info], None],
        on_msg: Callable[[codec.Msg], None],
        on_chunk: Callable[[], None],
        on_lost: Callable[[str], None],
        on_error: Callable[[str, bool], None],
    ) -> None:
        self.clock = clock
        self.max_buffer = max_buffer
        self.connect_options = connect_options
        self.tls = tls
        self.on_ready = on_ready
        self.on_msg = on_msg
        self.on_chunk = on_chunk
        self.on_lost = on_lost
        self.on_error = on_error
        self.parser = codec.Parser()
        self.info: codec.Info | None = None
        #: the server's max_payload (from its INFO; NATS's default until then)
        self.max_payload = 1 << 20
        self.ready = False
        #: one Deferred per PING of :meth:`ping` awaiting its PONG (None: the handshake's)
        self._pongs: deque[Deferred[None] | None] = deque()
        self.output = EngineOutput(max_buffer)
        self.lost = False
        #: where output goes: the TCP transport, or the TLS layer over it
        self.wire: Any = None
        self._tls: Any = None

    # -- output ----------------------------------------------------------------------------

    def write(self, data: bytes, force: bool = False) -> bool:
        """Queue ``data`` (protocol operations). False, and nothing queued, when the
        connection is not ready or ``max_buffer`` bytes already wait while the server does
        not read (``force``: queue anyway, for the node's own state)."""
        if not self.ready or self.lost:
            return False
        if not self.output.fits(len(data), force):
            return False
        self.output.queue(data)
        return True

    def flush(self) -> None:
        """Write what was queued, in one write (held instead while the server does not read)."""
        if not self.lost:
            self.output.flush()

    def close(self) -> None:
        """Close once what is written is sent (after TLS's close_notify)."""
        if self.wire is not None:
            self.wire.loseConnection()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abortConnection()

    def ping(self) -> Deferred[None]:
        """A PING, written with the next flush: fires at its PONG, when the server has
        handled everything written before it (NatsError if the connection goes first)."""
        d: Deferred[None] = Deferred()
        if not self.write(codec.PING, force=True):
            d.errback(NatsError("not connected"))
            return d
        self._pongs.append(d)
        return d

    @property
    def buffered(self) -> int:
        return self.output.buffered

    # -- Twisted ---------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self.wire = self.transport
        self.output.write = self.wire.write
        # small writes (a heartbeat, a lone message) go at once, not after the server's
        # delayed ACK of the previous one; the TLS upgrade later runs over this socket
        no_delay(self.transport)
        self.transport.registerProducer(self, True)

    def dataReceived(self, data: bytes) -> None:
        if self._tls is not None:
            self._tls.dataReceived(data)  # decrypted, it comes back to received()
        else:
            self.received(data)

    def received(self, data: bytes) -> None:
        """What the server sent (decrypted)."""
        try:
            events = self.parser.feed(data)
        except codec.NatsProtocolError as e:
            self.on_error(f"unreadable data from the NATS server: {e}", self.ready)
            self.abort()
            return
        on_msg = self.on_msg
        for event in events:
            if type(event) is codec.Msg:
                on_msg(event)
            elif type(event) is codec.Ping:
                self.wire.write(codec.PONG)  # at once: the server waits for it
            elif type(event) is codec.Pong:
                self._pong()
            elif type(event) is codec.Info:
                self._info(event)
            elif type(event) is codec.Err:
                self.on_error(event.text, self.ready)
            if self.lost:
                return
        if self.ready:
            self.on_chunk()

    def _info(self, info: codec.Info) -> None:
        first, self.info = self.info is None, info
        self.max_payload = info.max_payload
        if not first:
            return  # a later INFO (cluster topology news): nothing to do
        options = self.tls(info.tls_required)
        if options is not None:
            self._start_tls(options)
        self.wire.write(codec.connect(self.connect_options()) + codec.PING)
        self._pongs.append(None)

    def _start_tls(self, options: Any) -> None:
        """From now on every byte goes through TLS (the handshake first)."""
        from twisted.protocols.tls import TLSMemoryBIOFactory

        transport = self.transport
        transport.unregisterProducer()
        inner: Any = Factory.forProtocol(lambda: _Decrypted(self))
        factory = TLSMemoryBIOFactory(options, True, inner, clock=self.clock)
        tls = factory.buildProtocol(transport.getPeer())
        tls.makeConnection(transport)
        self._tls = self.wire = tls
        self.output.write = tls.write
        tls.registerProducer(self, True)

    def _pong(self) -> None:
        waiting = self._pongs.popleft() if self._pongs else None
        if waiting is not None:
            waiting.callback(None)
        elif not self.ready and self.info is not None:
            self.ready = True
            self.on_ready(self.info)

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:  # noqa: B008
        self.lost = True
        self.ready = False
        pongs, self._pongs = self._pongs, deque()
        for d in pongs:
            if d is not None:
                d.errback(NatsError("connection lost"))
        self.output.clear()
        if self._tls is not None:
            self._tls.connectionLost(reason)
        self.on_lost(reason.getErrorMessage())

    def pauseProducing(self) -> None:
        self.output.pause()

    def resumeProducing(self) -> None:
        self.output.resume()

    def stopProducing(self) -> None:
        """Nothing to stop: :meth:`connectionLost` follows when the connection ends."""


class _Decrypted(Protocol):
    """The protocol inside the TLS layer: hands the decrypted bytes to the connection
    (which hears of the connection's loss from the TCP transport itself)."""

    def __init__(self, connection: NatsConnection) -> None:
        self.connection = connection

    def dataReceived(self, data: bytes) -> None:
        self.connection.received(data)
