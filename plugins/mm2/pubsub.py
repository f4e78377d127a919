"""The Micromessage2 ``pubsub`` extension's commands and filters, sans-IO.

The spec names no commands; DECISIONS.md defines them::

    subscribe;destination=<enc>[,queue=<group>][,filter=<enc(key OP VALUE)>]...
    unsubscribe;destination=<enc>

A filter is ``key OP VALUE`` with VALUE typed as in properties (``N``, ``D``, ``T``).
Operators: ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` compare numbers and dates; text has
``=``, ``!=``, ``<`` (starts with), ``>`` (ends with), ``&`` (contains) and ``~`` (does
not contain); ``<=`` and ``>=`` on text, ``&`` and ``~`` on numbers are the peer's error.

Filters are read into the hub's own :class:`msgbroker.filters.Filter` (no Twisted there),
so a subscribe goes from the wire to ``Hub.subscribe`` as it is, and there is one
evaluator of filters for every protocol, not one per codec that could drift from it.
"""

from __future__ import annotations

import re

from attrs import frozen

from msgbroker.errors import RemoteProtocolError
from msgbroker.filters import Filter, Op

from .properties import (
    LENIENT_KEY_RE,
    Command,
    encode_value,
    is_valid_name,
    parse_value,
)

#: operators text does not have (DECISIONS.md: rejected with an ERROR frame)
_NUMERIC_ONLY = frozenset({Op.LE, Op.GE})
#: operators only text has (the spec lists them for text comparisons only)
_TEXT_ONLY = frozenset({Op.CONTAINS, Op.EXCLUDES})

# key, then the operator: the alternation lists two-character operators first, so
# "<=" is never read as "<" followed by a value "=..." (and "!=" needs its "!"); the value
# must start with its type letter, so there is never a second way to split.
_FILTER_RE = re.compile(r"([A-Za-z0-9_-]+)(!=|<=|>=|=|<|>|&|~)(.*)", re.DOTALL)


@frozen(slots=True)
class Subscribe:
    """``queue`` names a queue group (one member of it gets each message); ``None`` for a
    plain subscription."""

    destination: str
    queue: str | None = None
    filters: tuple[Filter, ...] = ()


@frozen(slots=True)
class Unsubscribe:
    destination: str


PubSubCommand = Subscribe | Unsubscribe

# -- filters --------------------------------------------------------------------------------


def parse_filter(text: str) -> Filter:
    """``key OP VALUE`` (already URL-decoded once, as the ``filter`` argument's value)."""
    match = _FILTER_RE.fullmatch(text)
    if match is None:
        raise RemoteProtocolError(f"bad filter {text[:40]!r}")
    key, op_text, raw = match.groups()
    if raw[:1] not in ("N", "D", "T"):
        raise RemoteProtocolError(f"filter value without a type prefix (N, D or T): {text[:40]!r}")
    op, value = Op(op_text), parse_value(raw)
    # checked here rather than left to Filter's ValueError: this is the peer's error
    if isinstance(value, str) and op in _NUMERIC_ONLY:
        raise RemoteProtocolError(f"operator {op_text} does not apply to text: {text[:40]!r}")
    if not isinstance(value, str) and op in _TEXT_ONLY:
        raise RemoteProtocolError(f"operator {op_text} applies to text only: {text[:40]!r}")
    return Filter(key, op, value)


def encode_filter(filter_: Filter) -> str:
    """The ``key OP VALUE`` text of ``filter_`` (before the argument's own URL encoding).
    A float value has no typed form (N is an integer, D a Decimal): TypeError."""
    if LENIENT_KEY_RE.fullmatch(filter_.key) is None:
        raise ValueError(f"bad filter key {filter_.key!r}")
    if isinstance(filter_.value, float):
        raise TypeError(f"a float has no Micromessage2 value type: {filter_.value!r}")
    return f"{filter_.key}{filter_.op.value}{encode_value(filter_.value)}"


# -- commands -------------------------------------------------------------------------------

_SUBSCRIBE_KEYS = frozenset({"destination", "queue", "filter"})


def parse_pubsub(command: Command) -> PubSubCommand | None:
    """The pubsub request ``command`` stands for; None when it is not a pubsub command.

    An unknown argument is the peer's error rather than ignored: a mistyped ``filter`` that
    were silently dropped would deliver what the subscriber meant to filter out.
    """
    if command.name not in ("subscribe", "unsubscribe"):
        return None
    allowed = _SUBSCRIBE_KEYS if command.name == "subscribe" else {"destination"}
    for key, _ in command.args:
        if key not in allowed:
            raise RemoteProtocolError(f"{command.name}: unknown argument {key!r}")
    destinations = command.get_all("destination")
    if len(destinations) != 1:
        raise RemoteProtocolError(f"{command.name} needs exactly one destination")
    destination = destinations[0]
    if not destination or not is_valid_name(destination):
        raise RemoteProtocolError(f"bad destination {destination[:40]!r}")
    if command.name == "unsubscribe":
        return Unsubscribe(destination)
    queues = command.get_all("queue")
    if len(queues) > 1 or (queues and not is_valid_name(queues[0])) or "" in queues:
        raise RemoteProtocolError("subscribe: at most one queue, a non-empty printable name")
    filters = tuple(parse_filter(text) for text in command.get_all("filter"))
    return Subscribe(destination, queues[0] if queues else None, filters)


def encode_pubsub(request: PubSubCommand) -> Command:
    """The command that asks for ``request``; ValueError for what the peer would reject."""
    if not request.destination or not is_valid_name(request.destination):
        raise ValueError(f"bad destination {request.destination!r}")
    if isinstance(request, Unsubscribe):
        return Command("unsubscribe", (("destination", request.destination),))
    args = [("destination", request.destination)]
    if request.queue is not None:
        if not request.queue or not is_valid_name(request.queue):
            raise ValueError(f"bad queue name {request.queue!r}")
        args.append(("queue", request.queue))
    args.extend(("filter", encode_filter(filter_)) for filter_ in request.filters)
    return Command("subscribe", tuple(args))
