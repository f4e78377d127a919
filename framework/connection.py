"""What every protocol's Twisted adapter shares: the session's lifecycle and its timers.

:class:`BrokerProtocol` opens a :class:`~msgbroker.session.Session` when the connection is
made and closes it (hub, hooks) when the connection is lost, whatever the reason; it runs
the login timeout and the keepalive timer. A protocol subclass sets ``name`` and
``encode``, implements ``dataReceived``, and overrides :meth:`send_keepalive`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ClassVar

from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from .tls import peer_names

if TYPE_CHECKING:
    from .broker import Broker
    from .config import Listener
    from .session import Session


class IdleTimer:
    """Keepalive: ``interval`` s after the last activity call ``on_idle`` (send a ping);
    another ``interval`` s with no activity and call ``on_dead``.

    Activity is recorded by :meth:`touch` (once per received chunk, not per message); the
    timer itself re-arms only when it fires, so a busy connection costs one clock read per
    chunk and nothing per message.
    """

    __slots__ = (
        "_call",
        "_clock",
        "_held",
        "_interval",
        "_on_dead",
        "_on_idle",
        "_pinged_at",
        "last",
    )

    def __init__(
        self,
        clock: Any,
        interval: float,
        on_idle: Any,
        on_dead: Any,
        held: Any = None,
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._on_idle = on_idle
        self._on_dead = on_dead
        #: ``held()`` is True while the broker itself stopped reading from the peer (flood
        #: control pausing a publisher): its silence is ours, so it counts as activity
        self._held = held
        self._pinged_at: float | None = None
        self.last = clock.seconds()
        self._call: Any = clock.callLater(interval, self._check)

    def touch(self) -> None:
        self.last = self._clock.seconds()

    def _check(self) -> None:
        now = self._clock.seconds()
        if self._held is not None and self._held():
            self.last = now
        idle = now - self.last
        if idle < self._interval:
            self._pinged_at = None
            self._call = self._clock.callLater(self._interval - idle, self._check)
        elif self._pinged_at is not None and self.last < self._pinged_at:
            self._call = None  # pinged, and nothing at all came back since
            self._on_dead()
        else:
            self._pinged_at = now
            self._call = self._clock.callLater(self._interval, self._check)
            self._on_idle()

    def cancel(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None


def no_delay(transport: Any) -> None:
    """Disable Nagle's algorithm on the TCP socket under ``transport`` (through TLS).

    A broker answers small requests with small writes; with Nagle, a reply written while
    an earlier one is unacknowledged waits for the peer's delayed ACK (40 ms on Linux).
    Throughput does not suffer: the transport still coalesces each reactor turn's writes.
    """
    for _ in range(4):
        set_no_delay = getattr(type(transport), "setTcpNoDelay", None)
        if set_no_delay is not None and hasattr(transport, "socket"):
            with contextlib.suppress(OSError):  # not a TCP socket after all (unix)
                transport.setTcpNoDelay(True)
            return
        transport = getattr(transport, "transport", None)
        if transport is None:
            return


class BrokerProtocol(Protocol):
    """Base of the protocols' server-side Twisted adapters."""

    name: ClassVar[str]
    #: the protocol's encoder (a staticmethod on subclasses)
    encode: ClassVar[Any]

    session: Session
    _idle: IdleTimer | None = None
    _login_timer: Any = None

    def __init__(self, broker: Broker, listener: Listener) -> None:
        self.broker = broker
        self.hub = broker.hub
        self.listener = listener
        self.clock = broker.reactor

    def connectionMade(self) -> None:
        transport: Any = self.transport
        no_delay(transport)
        peer = transport.getPeer()
        self.session = self.broker.open_session(
            protocol=self.name,
            encode=type(self).encode,
            transport=self.transport,
            closer=self.close_connection,
            host=getattr(peer, "host", "") or "",
        )
        self._login_timer = self.clock.callLater(
            self.broker.config.login_timeout, self.login_timed_out
        )

    def logged_in(self) -> None:
        """Call once the login succeeded: stops the login timer, starts the keepalive."""
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None
        session = self.session
        self._idle = IdleTimer(
            self.clock,
            self.broker.config.keepalive,
            self.send_keepalive,
            self.keepalive_expired,
            held=lambda: session.reading_held,
        )

    def touch(self) -> None:
        if self._idle is not None:
            self._idle.touch()

    def peer_certificate_names(self) -> frozenset[str] | None:
        """Names the verified client certificate proves (after the TLS handshake, so ask
        at login, not at connection time); ``None`` without TLS or without a certificate."""
        names = peer_names(self.transport)
        self.session.tls_names = names
        return names

    def login_timed_out(self) -> None:
        self._login_timer = None
        self.session.close("login timeout")

    def keepalive_expired(self) -> None:
        self.session.close("keepalive timeout")

    def send_keepalive(self) -> None:
        """Send the protocol's ping."""

    def close_connection(self, reason: str) -> None:
        """Close the transport. A slow consumer is aborted (its buffer will never drain);
        anything else is flushed first."""
        transport: Any = self.transport
        # a registered producer keeps a TLS transport from finishing its close
        transport.unregisterProducer()
        if reason == "slow consumer":
            transport.abortConnection()
        else:
            transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        if self._idle is not None:
            self._idle.cancel()
        session = getattr(self, "session", None)
        if session is not None:
            self.broker.session_closed(session, "closed by peer")
            callbacks, session.on_lost = session.on_lost, []
            for callback in callbacks:
                callback()


class BrokerFactory(Factory):
    """Builds one protocol instance per connection of one listener."""

    def __init__(self, protocol_class: type[BrokerProtocol], broker: Broker, listener: Listener):
        self.protocol_class = protocol_class
        self.broker = broker
        self.listener = listener

    def buildProtocol(self, addr: Any) -> BrokerProtocol | None:
        if not self.broker.admit(addr):
            return None  # over a connection limit: Twisted closes the socket at once
        proto = self.protocol_class(self.broker, self.listener)
        proto.factory = self
        return proto

    def doStart(self) -> None:  # quiet: the service logs what each listener is bound to
        self.numPorts += 1

    def doStop(self) -> None:
        self.numPorts -= 1
