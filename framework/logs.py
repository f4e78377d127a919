"""What ``twistd msgbroker`` logs: events at ``--log-level`` and above, without Twisted's
per-listener noise.

twistd picks its log observer (stdout with ``-n``, else ``twistd.log`` with its rotation)
and starts logging after ``makeService`` ran, through ``globalLogBeginner``. So the broker
puts a filter in front of whatever observers twistd begins logging to: debug lines (a
client's grammar error, a skipped recipient) stay out unless asked for, so a misbehaving
client cannot flood the log, and so do the ``<Factory> starting on <port>`` and ``(... Port
N Closed)`` lines Twisted writes for every listener (the broker says where it listens
itself). The level can change while running (:func:`set_level`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogLevel,
    PredicateResult,
    globalLogBeginner,
)
from zope.interface import implementer

LEVELS = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "error": LogLevel.error,
}
#: what Twisted's ports and factories say each time one starts or stops listening
_NOISE = re.compile(
    r"^(?:\S+ starting on \S+|\(\S+ Port \S+ Closed\)|(?:Starting|Stopping) factory .*)$"
)


@implementer(ILogFilterPredicate)
class BrokerLogFilter:
    """The predicate: drops events below the level, and Twisted's listener noise."""

    def __init__(self, level: str = "info") -> None:
        self.level = LEVELS[level]

    def __call__(self, event: dict[str, Any]) -> PredicateResult:
        level = event.get("log_level")
        if (
            level is not None
            and level < LogLevel.error
            and str(event.get("log_namespace", "")).startswith(_CLIENTS_FAULTS)
        ):
            level = LogLevel.debug  # what a client got wrong: as our protocols log it
        if level is not None and level < self.level:
            return _NO
        text = event.get("log_text")
        if text is None and "message" in event and isinstance(event["message"], tuple):
            text = " ".join(str(part) for part in event["message"])
        if isinstance(text, str) and _NOISE.match(text):
            return _NO
        return _MAYBE


#: libraries that log a client's bad handshake at info or warn, one line per connection
#: (autobahn: "failing WebSocket opening handshake", "dropping connection to peer"): below
#: error they count as debug, so a misbehaving client cannot flood the log through them
_CLIENTS_FAULTS = ("autobahn.",)

_NO = cast(PredicateResult, PredicateResult.no)
_MAYBE = cast(PredicateResult, PredicateResult.maybe)

#: the one filter of this process (twistd runs one broker)
log_filter = BrokerLogFilter()
_installed = False


def set_level(level: str) -> None:
    """Log events at ``level`` (debug, info, warn, error) and above from now on."""
    log_filter.level = LEVELS[level]


def filter_twistd_logging(level: str) -> None:
    """Filter what logging will begin to (call before twistd starts logging, i.e. from
    ``makeService``); once per process, later calls only change the level."""
    global _installed
    set_level(level)
    if _installed:
        return
    _installed = True
    begin = globalLogBeginner.beginLoggingTo

    def begin_filtered(observers: Iterable[ILogObserver], *args: Any, **kwargs: Any) -> None:
        wrapped = [
            cast(ILogObserver, FilteringLogObserver(observer, [cast(Any, log_filter)]))
            for observer in observers
        ]
        begin(wrapped, *args, **kwargs)

    globalLogBeginner.beginLoggingTo = begin_filtered  # type: ignore[method-assign]
