"""The broker's own counters, beside the hub's :class:`~msgbroker.topics.HubStats`: logins,
closes by reason, and the traffic of the sessions that are gone, per protocol.

Everything here is a plain int bumped once per connection or per login, never per message;
the per-message figures live on each :class:`~msgbroker.session.Session` (counted once per
input and per written batch) and are added up only when someone asks
(:meth:`BrokerCounters.traffic`), as a metrics scrape does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from attrs import define, field

if TYPE_CHECKING:
    from .session import Session


@define
class Traffic:
    """What one protocol's sessions moved, in all."""

    #: connections opened
    connections: int = 0
    bytes_in: int = 0
    messages_in: int = 0
    bytes_out: int = 0
    frames_out: int = 0

    def add(self, session: Session) -> None:
        """Count ``session``'s traffic in."""
        self.bytes_in += session.bytes_in
        self.messages_in += session.messages_in
        self.bytes_out += session.bytes_out
        self.frames_out += session.frames_out


@define
class BrokerCounters:
    """Counters the broker keeps (``broker.counters``)."""

    #: logins accepted, and refused (a refusal by the failed-login throttle included)
    logins: int = 0
    login_failures: int = 0
    #: sessions closed, by reason (a :class:`~msgbroker.reasons.CloseReason` value)
    closed: dict[str, int] = field(factory=dict)
    #: per protocol: connections opened, and the traffic of the sessions that are gone
    gone: dict[str, Traffic] = field(factory=dict)

    def opened(self, session: Session) -> None:
        traffic = self.gone.get(session.protocol)
        if traffic is None:
            traffic = self.gone[session.protocol] = Traffic()
        traffic.connections += 1

    def ended(self, session: Session, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1
        traffic = self.gone.get(session.protocol)
        if traffic is None:
            traffic = self.gone[session.protocol] = Traffic()
        traffic.add(session)

    def traffic(self, open_sessions: Iterable[Session]) -> dict[str, Traffic]:
        """Per protocol, everything moved since the broker started: the sessions gone and
        ``open_sessions`` (the broker's open ones) added up now."""
        totals = {name: Traffic(connections=t.connections) for name, t in self.gone.items()}
        for name, traffic in self.gone.items():
            total = totals[name]
            total.bytes_in = traffic.bytes_in
            total.messages_in = traffic.messages_in
            total.bytes_out = traffic.bytes_out
            total.frames_out = traffic.frames_out
        for session in open_sessions:
            found = totals.get(session.protocol)
            if found is None:
                found = totals[session.protocol] = Traffic()
            found.add(session)
        return totals
