"""The Micromessage2 ``pubsub`` extension's commands and filters, sans-IO.

The spec names no commands; DECISIONS.md defines them::

    subscribe;destination=<enc>[,queue=<group>][,filter=<enc(key OP VALUE)>]...
    unsubscribe;destination=<enc>

A filter is ``key OP VALUE`` with VALUE typed as in properties (``N``, ``D``, ``T``).
Operators: ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` compare numbers and dates; text has
``=``, ``!=``, ``<`` (starts with), ``>`` (ends with), ``&`` (contains) and ``~`` (does
not contain). Filters of one subscription are ANDed. A message without the property never
matches, whatever the operator.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

from .properties import (
    LENIENT_KEY_RE,
    Command,
    PropertyValue,
    encode_value,
    is_valid_name,
    parse_value,
)


class Op(StrEnum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    CONTAINS = "&"
    NOT_CONTAINS = "~"


#: operators text does not have (DECISIONS.md: rejected with an ERROR frame)
_NUMERIC_ONLY = frozenset({Op.LE, Op.GE})
#: operators only text has (the spec lists them for text comparisons only)
_TEXT_ONLY = frozenset({Op.CONTAINS, Op.NOT_CONTAINS})

# key, then the operator: the alternation lists two-character operators first, so
# "<=" is never read as "<" followed by a value "=..." (and "!=" needs its "!"); the value
# must start with its type letter, so there is never a second way to split.
_FILTER_RE = re.compile(r"([A-Za-z0-9_-]+)(!=|<=|>=|=|<|>|&|~)(.*)", re.DOTALL)


@frozen(slots=True)
class Filter:
    """``key OP value``; ``value`` is an int (N), a Decimal (D) or a str (T)."""

    key: str
    op: Op
    value: PropertyValue


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
    return _checked(Filter(key, Op(op_text), parse_value(raw)), RemoteProtocolError)


def encode_filter(filter_: Filter) -> str:
    """The ``key OP VALUE`` text of ``filter_`` (before the argument's own URL encoding)."""
    _checked(filter_, ValueError)
    if LENIENT_KEY_RE.fullmatch(filter_.key) is None:
        raise ValueError(f"bad filter key {filter_.key!r}")
    return f"{filter_.key}{filter_.op.value}{encode_value(filter_.value)}"


def _checked(filter_: Filter, error: type[Exception]) -> Filter:
    is_text = isinstance(filter_.value, str)
    if is_text and filter_.op in _NUMERIC_ONLY:
        raise error(f"operator {filter_.op.value} does not apply to text")
    if not is_text and filter_.op in _TEXT_ONLY:
        raise error(f"operator {filter_.op.value} applies to text only")
    return filter_


def matches(filter_: Filter, properties: Mapping[str, PropertyValue]) -> bool:
    """Whether a message with ``properties`` passes ``filter_``.

    The property must exist and have the filter's type: N (int) and D (Decimal) compare
    numerically, but a number is not a date, so an N property never matches a D filter
    (nor text a number). Text compares case-sensitively (the spec).
    """
    if filter_.key not in properties:
        return False
    have, want = properties[filter_.key], filter_.value
    kind = _kind(want)
    if kind is None or _kind(have) is not kind:
        return False
    test = (_TEXT_TESTS if kind is str else _NUMBER_TESTS).get(filter_.op)
    # None: an operator the type does not have, which parse_filter never builds
    return test is not None and test(have, want)


def _kind(value: object) -> type | None:
    """int, Decimal or str: the type a value compares as (a bool is no number here)."""
    if isinstance(value, bool):
        return None
    for kind in (int, Decimal, str):
        if isinstance(value, kind):
            return kind
    return None


_NUMBER_TESTS: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}
_TEXT_TESTS: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: str.startswith,
    Op.GT: str.endswith,
    Op.CONTAINS: operator.contains,
    Op.NOT_CONTAINS: lambda have, want: want not in have,
}


def matches_all(filters: Iterable[Filter], properties: Mapping[str, PropertyValue]) -> bool:
    """Whether every filter passes (DECISIONS.md: filters are ANDed; none passes all)."""
    return all(matches(filter_, properties) for filter_ in filters)


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
