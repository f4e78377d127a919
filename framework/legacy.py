"""TRANSITIONAL (issue 13): the old inherited adapter, over the new Session, so protocols
not yet ported to :class:`msgbroker.connection.ServerSession` keep working. Deleted when
the last protocol is ported; nothing new may use it."""

from __future__ import annotations

from typing import Any, ClassVar

from twisted.internet.protocol import Factory, Protocol

from .connection import no_delay, reading_transport
from .output import TransportOutput
from .reasons import CloseReason
from .timers import Keepalive, Timers
from .tls import peer_names


def as_reason(text: str | CloseReason) -> tuple[CloseReason, str]:
    if isinstance(text, CloseReason):
        return text, ""
    head, _, detail = text.partition(": ")
    try:
        return CloseReason(head), detail
    except ValueError:
        return CloseReason.PROTOCOL_ERROR, text


class BrokerProtocol(Protocol):
    name: ClassVar[str]
    encode: ClassVar[Any]
    session: Any
    _idle: Any = None
    _login_timer: Any = None

    def __init__(self, broker: Any, listener: Any) -> None:
        self.broker = broker
        self.hub = broker.hub
        self.listener = listener
        self.clock = broker.reactor

    def connectionMade(self) -> None:
        transport: Any = self.transport
        no_delay(transport)
        peer = transport.getPeer()
        broker = self.broker
        self.session = broker.open_session(
            protocol=self.name,
            encode=type(self).encode,
            link=self,
            host=getattr(peer, "host", "") or "",
            make_output=lambda s: TransportOutput(
                s, transport, broker.policy, broker.batcher, broker.output_budget
            ),
        )
        self._login_timer = self.clock.callLater(
            self.broker.config.login_timeout, self.login_timed_out
        )

    def logged_in(self) -> None:
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None
        session = self.session
        timers = Timers(self.clock.seconds, self._wake)
        self._timers = timers
        self._wakeup: Any = None
        self._idle = Keepalive(
            timers,
            self.broker.config.keepalive,
            self.send_keepalive,
            self.keepalive_expired,
            held=lambda: session.reading_held,
        )

    def _wake(self, at: float) -> None:
        w = getattr(self, "_wakeup", None)
        if w is not None and w.active():
            w.cancel()
        self._wakeup = self.clock.callLater(max(0.0, at - self.clock.seconds()), self._timers.tick)

    def touch(self) -> None:
        if self._idle is not None:
            self._idle.touch()

    def peer_certificate_names(self) -> frozenset[str] | None:
        names = peer_names(self.transport)
        self.session.tls_names = names
        return names

    def login_timed_out(self) -> None:
        self._login_timer = None
        self.session.close(CloseReason.LOGIN_TIMEOUT)

    def keepalive_expired(self) -> None:
        self.session.close(CloseReason.KEEPALIVE_TIMEOUT)

    def send_keepalive(self) -> None:
        pass

    # Link
    def close_transport(self, reason: CloseReason) -> None:
        self.close_connection(self.session.close_text or str(reason))

    def abort(self) -> None:
        self.transport.abortConnection()  # type: ignore[union-attr]

    def pause_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.pauseProducing()

    def resume_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.resumeProducing()

    def certificate_names(self) -> frozenset[str] | None:
        return peer_names(self.transport)

    def close_connection(self, reason: str) -> None:
        transport: Any = self.transport
        transport.unregisterProducer()
        if reason == "slow consumer":
            transport.abortConnection()
        else:
            transport.loseConnection()

    def connectionLost(self, reason: Any = None) -> None:
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        if self._idle is not None:
            self._idle.cancel()
            w = getattr(self, "_wakeup", None)
            if w is not None and w.active():
                w.cancel()
        session = getattr(self, "session", None)
        if session is not None:
            self.broker.session_closed(session, CloseReason.PEER)
            callbacks, session.on_lost = session.on_lost, []
            for callback in callbacks:
                callback()


class BrokerFactory(Factory):
    def __init__(self, protocol_class: Any, broker: Any, listener: Any) -> None:
        self.protocol_class = protocol_class
        self.broker = broker
        self.listener = listener

    def buildProtocol(self, addr: Any) -> Any:
        if not self.broker.admit(addr):
            return None
        proto = self.protocol_class(self.broker, self.listener)
        proto.factory = self
        return proto

    def doStart(self) -> None:
        self.numPorts += 1

    def doStop(self) -> None:
        self.numPorts -= 1


class LegacyLink:
    """TRANSITIONAL: a Link for adapters that still close through a ``closer(reason)``."""

    def __init__(self, transport: Any, closer: Any) -> None:
        self.transport = transport
        self.closer = closer

    session: Any = None

    def close_transport(self, reason: CloseReason) -> None:
        text = self.session.close_text if self.session is not None else None
        self.closer(text or str(reason))

    def abort(self) -> None:
        self.transport.abortConnection()

    def pause_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.pauseProducing()

    def resume_reading(self) -> None:
        reader = reading_transport(self.transport)
        if reader is not None:
            reader.resumeProducing()

    def certificate_names(self) -> frozenset[str] | None:
        return peer_names(self.transport)


class OutboxOutput:
    """TRANSITIONAL: sbus's outbox as an Output."""

    def __init__(self, outbox: Any) -> None:
        self.outbox = outbox
        self.send = outbox.offer
        self.reply = outbox.reply
        self.measure = outbox.measure
        self.cut = outbox.cut

    def flush(self) -> None:
        pass

    def stop(self) -> None:
        self.outbox.close()


def open_legacy_session(
    broker: Any, protocol: str, encode: Any, transport: Any, closer: Any, host: str,
    output: Any = None,
) -> Any:
    """TRANSITIONAL: ``broker.open_session`` with the old arguments."""
    link = LegacyLink(transport, closer)
    link.session = broker.open_session(
        protocol=protocol,
        encode=encode,
        link=link,
        host=host,
        make_output=lambda s: output
        if output is not None
        else TransportOutput(s, transport, broker.policy, broker.batcher, broker.output_budget),
    )
    return link.session
