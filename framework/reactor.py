"""The reactor ``twistd msgbroker`` runs on: Twisted's epoll reactor without the per-event
costs a broker does not need, and with a call at the end of each poll.

Twisted's :class:`~twisted.internet.epollreactor.EPollReactor` hands every readiness
event to ``log.callWithLogger``, which asks the connection for its log prefix, copies the
legacy log context and pushes it for the duration of the call, so that legacy ``log.msg``
lines show the connection as their "system": 2.1 µs per event on the benchmark machine,
on a request/reply round trip of two events. msgbroker logs through ``twisted.logger``
namespaces and never reads that context, so :class:`BrokerReactor` calls the handler
directly (an exception it lets out is logged, as there).

It also runs what was registered with :meth:`BrokerReactor.call_after_poll` once every
event of the poll has been handled — the end of the reactor turn the output batcher
writes at (:class:`msgbroker.output.Batcher`), without a ``DelayedCall`` per turn. While
such a call is waiting, the next poll does not block, so a call registered from a timer
or a thread runs at once too.

twistd installs it when the command line chose no reactor (``twistd --reactor=NAME
msgbroker`` picks another: the broker runs on any reactor, with ``callLater(0)`` for the
end of the turn). Linux only, as epoll; elsewhere twistd's default stays.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

log = Logger(namespace="msgbroker.reactor")

try:
    from twisted.internet.epollreactor import EPollReactor
except ImportError:  # no epoll here: twistd's default reactor is used
    EPollReactor = None  # type: ignore[assignment,misc]


if EPollReactor is not None:

    class BrokerReactor(EPollReactor):
        """:class:`EPollReactor` without a log context per event, with end-of-poll calls
        (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self._after_poll: list[Callable[[], None]] = []

        def call_after_poll(self, call: Callable[[], None]) -> None:
            """Call ``call`` once the events of the current poll have been handled (or
            after the next poll, which will not wait, when none is under way)."""
            self._after_poll.append(call)

        def doPoll(self, timeout: float | None) -> None:
            after = self._after_poll
            if after:
                timeout = 0  # something waits for the end of this turn: do not block
            elif timeout is None:
                timeout = -1
            try:
                events: Any = self._poller.poll(timeout, len(self._selectables))
            except OSError as err:
                if err.errno != errno.EINTR:
                    raise
                events = ()
            selectables = self._selectables
            handle = self._doReadOrWrite
            for fd, event in events:
                selectable = selectables.get(fd)
                if selectable is not None:
                    try:
                        handle(selectable, fd, event)
                    except Exception:  # as callWithLogger: logged, the loop goes on
                        log.failure("error handling {selectable!r}", selectable=selectable)
            while after:
                calls = after[:]
                after.clear()
                for call in calls:
                    try:
                        call()
                    except Exception:
                        log.failure("error in an end-of-turn call {call!r}", call=call)

        doIteration = doPoll


def install() -> Any:
    """Install :class:`BrokerReactor` as the global reactor and return it, or None where
    there is no epoll (or a reactor is installed already): then nothing changes."""
    if EPollReactor is None or "twisted.internet.reactor" in sys.modules:
        return None
    from twisted.internet.main import installReactor

    reactor = BrokerReactor()
    installReactor(reactor)
    return reactor
