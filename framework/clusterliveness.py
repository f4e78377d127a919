"""How long a node waits before it takes another node for gone, when it reads behind.

A node beats every ``heartbeat`` and its peers take it for gone after ``node_timeout``
without a word from it. But the word travels on the engine's connection behind whatever
was published before it: a node busy reading a flood of messages reads every heartbeat
late, and would take its live peers for gone (their members' UNSUBSCRIBE events, their
identities freed, its publications to them stopped) merely for being behind.

Two things prevent that:

- **Data is a sign of life.** A publication from a node proves it was alive when it sent
  it, as a heartbeat does (:meth:`~msgbroker.clustertraffic.Traffic.delivered` notes it).
- **A node measures how far behind it reads**, by its own heartbeats: the engine sends a
  node its own announcements back, in order with everything else, so a heartbeat not back
  yet says the node has not read what was published since. While one is missing for
  longer than a quarter heartbeat (normally it is back within a round trip), every peer
  gets that much longer (plus one heartbeat, the most a read position can lag behind the
  oldest missing beat), up to ``MAX_TIMEOUTS`` node timeouts, so that a node whose own
  beats never come back still sees dead peers go.

A node that reads in time waits exactly ``node_timeout``: a dead node is seen gone as
fast as before.
"""

from __future__ import annotations

from collections import deque

from attrs import define, field

__all__ = ["MAX_TIMEOUTS", "ReadLag"]

#: the most a node reading behind extends its peers' timeout, in node timeouts
MAX_TIMEOUTS = 10


@define
class ReadLag:
    """This node's own heartbeats sent and not heard back yet (their send times)."""

    heartbeat: float
    timeout: float
    _out: deque[float] = field(factory=deque)

    def sent(self, now: float) -> None:
        """A heartbeat of ours went out at ``now``."""
        self._out.append(now)

    def heard(self) -> None:
        """The oldest heartbeat of ours came back."""
        if self._out:
            self._out.popleft()

    def reset(self) -> None:
        """The engine connection was lost or made again: what was out will not come back."""
        self._out.clear()

    def behind(self, now: float) -> float:
        """Seconds the oldest heartbeat of ours has been out (0: none is)."""
        return now - self._out[0] if self._out else 0.0

    def allowance(self, now: float) -> float:
        """Seconds added to every peer's timeout now: 0 while this node reads in time."""
        behind = self.behind(now)
        if behind <= self.heartbeat / 4:
            return 0.0
        return min(behind + self.heartbeat, MAX_TIMEOUTS * self.timeout)
