"""Waiting on a cluster node's state (public API): :class:`ClusterChanges`.

What a node knows of the cluster — the other nodes and their state (its view), whether the
engine is connected, what it counted — changes only when something happens on the reactor
thread: a chunk from the engine was applied, a snapshot was read, the engine connected or
was lost, a node was seen gone (also on a timer: a missed heartbeat). ``cluster.changes``
(:class:`msgbroker.cluster.Cluster`) is told after each, so whoever must act once the node
is in some state (a test, a plugin waiting for a peer) waits on that, never polls::

    d = broker.cluster.changes.when(lambda: broker.cluster.interested("news"))
    d.addCallback(lambda _: start_publishing())   # at once, or after the change

A notification is a hint ("may have changed"), not a diff: a listener looks at the state
itself. With nobody listening it costs one truth test per engine chunk, nothing per message.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

__all__ = ["ClusterChanges"]

log = Logger(namespace="msgbroker.cluster")


class ClusterChanges:
    """Listeners called (in the reactor thread) after each change of a node's cluster state."""

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Callable[[], object]] = []

    def listen(self, listener: Callable[[], object]) -> Callable[[], None]:
        """Call ``listener()`` after each change from now on; returns the function that
        stops it (calling that twice is harmless)."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def notify(self) -> None:
        """The state may have changed: call every listener (one that raises is logged and
        the others still run; the node goes on)."""
        if not self._listeners:
            return
        for listener in tuple(self._listeners):
            try:
                listener()
            except Exception:
                log.failure("cluster: a listener of the node's changes failed")

    def when(self, check: Callable[[], bool]) -> Deferred[None]:
        """A Deferred that fires once ``check()`` is true: at once when it is now, else
        after the first change that makes it so (``check`` runs after each change until
        then). Cancelling it stops the waiting; an exception from ``check`` fails it."""
        if check():
            return succeed(None)
        def cancelled(d: Deferred[None]) -> None:
            stop()

        waiting: Deferred[None] = Deferred(cancelled)

        def look() -> None:
            if waiting.called:
                stop()
                return
            try:
                holds = check()
            except Exception as e:  # the waiter hears of it, the node does not
                stop()
                waiting.errback(e)
                return
            if holds:
                stop()
                waiting.callback(None)

        stop = self.listen(look)
        return waiting

    @property
    def listening(self) -> int:
        """How many listeners there are."""
        return len(self._listeners)

