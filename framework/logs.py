"""What ``twistd msgbroker`` logs: events at ``--log-level`` and above, without Twisted's
per-listener noise.

twistd picks its log observer (stdout with ``-n``, else ``twistd.log`` with its rotation)
and starts logging after ``makeService`` ran, through ``globalLogBeginner``. So the broker
puts a filter in front of whatever observers twistd begins logging to: debug lines (a
client's grammar error, a skipped recipient) stay out unless asked for, so a misbehaving
client cannot flood the log, and so do the ``<Factory> starting on <port>`` and ``(... Port
N Closed)`` lines Twisted writes for every listener (the broker says where it listens
itself). The level can change while running (:func:`set_level`).

``--log-format json`` makes the same observers write one JSON object per line instead
(:func:`json_line`): ``time``, ``level``, ``namespace``, ``text`` and the event's own
fields that are plain values (a protocol, an address, a count), for a log shipper to read
without parsing text. It applies to the file (or stdout) twistd writes to, with its
rotation; an observer of one's own (``twistd --logger``, ``--syslog``) is left as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from twisted.logger import (
    FileLogObserver,
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogLevel,
    PredicateResult,
    formatEvent,
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
#: (a TLS listener's factory is "StreamFactory (TLS)")
_NOISE = re.compile(
    r"^(?:\S+(?: \(TLS\))? starting on \S+|\(\S+ Port \S+ Closed\)"
    r"|(?:Starting|Stopping) factory .*)$"
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
#: the format lines are written in (``--log-format``), read when logging begins
_format = "text"

#: keys of a Twisted event that are its own bookkeeping, not the event's fields (``log_*``
#: are left out too): the legacy ``twisted.python.log`` keys and what they duplicate
_NOT_FIELDS = frozenset({"format", "message", "isError", "system", "time", "why", "failure"})


def set_level(level: str) -> None:
    """Log events at ``level`` (debug, info, warn, error) and above from now on."""
    log_filter.level = LEVELS[level]


def json_line(event: dict[str, Any]) -> str:
    """``event`` as one line of JSON: ``time`` (UTC, ISO 8601), ``level``, ``namespace``,
    ``message`` (the line the text format shows), ``traceback`` for a failure, then each of
    the event's fields whose value is a string, number, boolean or null (an object could
    say anything; the broker never puts a credential in a field)."""
    when = event.get("log_time")
    level = event.get("log_level")
    record: dict[str, Any] = {
        "time": None
        if when is None
        else datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds"),
        "level": getattr(level, "name", "info"),
        "namespace": str(event.get("log_namespace", "-")),
        "message": formatEvent(event),
    }
    failure = event.get("log_failure")
    if failure is not None:
        try:
            record["traceback"] = failure.getTraceback()
        except Exception:  # a broken failure must not cost the line
            record["traceback"] = repr(failure)
    for key, value in event.items():
        if key in record or key.startswith("log_") or key in _NOT_FIELDS:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            record[key] = str(value)  # JSON has no NaN or infinity
        elif value is None or isinstance(value, str | int | float):
            record[key] = value
    return json.dumps(record) + "\n"


def filter_twistd_logging(level: str, log_format: str = "text") -> None:
    """Filter what logging will begin to (call before twistd starts logging, i.e. from
    ``makeService``), in ``log_format`` (text, json); once per process, later calls only
    change the level and the format."""
    global _installed, _format
    set_level(level)
    _format = log_format
    if _installed:
        return
    _installed = True
    begin = globalLogBeginner.beginLoggingTo

    def begin_filtered(observers: Iterable[ILogObserver], *args: Any, **kwargs: Any) -> None:
        observers = list(observers)
        if _format == "json":
            for observer in observers:
                if isinstance(observer, FileLogObserver):  # twistd's stdout or log file
                    observer.formatEvent = json_line
        wrapped = [
            cast(ILogObserver, FilteringLogObserver(observer, [cast(Any, log_filter)]))
            for observer in observers
        ]
        begin(wrapped, *args, **kwargs)

    globalLogBeginner.beginLoggingTo = begin_filtered  # type: ignore[method-assign]
