"""Property filters: a subscription may ask for only the messages whose typed properties
satisfy every one of its filters (Micromessage2's pubsub extension, DECISIONS.md).

A message's ``properties`` map names to numbers (``int``, ``float`` or ``Decimal``: the
N and D values) or text (``str``: T values). A :class:`Filter` compares one property with a
value:

- numbers: ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, numerically (an N filter matches a D
  property and the other way round);
- text: ``=``, ``!=``, ``<`` starts with, ``>`` ends with, ``&`` contains, ``~`` does not
  contain; ``<=`` and ``>=`` are refused (:class:`ValueError`), as are ``&`` and ``~`` on
  numbers.

A message without the property never matches, whatever the operator (``!=`` and ``~``
included); nor does one whose property has the other type (text against a number).
Numbers are finite (the protocols parse them so).

:class:`FilterIndex` holds the filtered subscriptions of one topic so that a publish costs
in proportion to the subscriptions that could match, not to all of them: each distinct set
of filters is filed under one of its filters (an equality by value, a text prefix or suffix
by its text, a numeric bound in a sorted list), and only the sets that filing turns up are
checked in full.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any, Generic, TypeVar

from attrs import define, field, frozen

Number = int | float | Decimal
Value = Number | str


class Op(StrEnum):
    EQ = "="
    NE = "!="
    LT = "<"  #: text: starts with
    LE = "<="
    GT = ">"  #: text: ends with
    GE = ">="
    CONTAINS = "&"  #: text only
    EXCLUDES = "~"  #: text only: does not contain


_TEXT_ONLY = frozenset({Op.CONTAINS, Op.EXCLUDES})
_NUMBER_ONLY = frozenset({Op.LE, Op.GE})


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _finite(value: Number) -> bool:
    return value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)


@frozen
class Filter:
    """``key OP value``: true of a message whose property ``key`` satisfies it."""

    key: str
    op: Op = field(converter=Op)
    value: Value

    def __attrs_post_init__(self) -> None:
        if isinstance(self.value, str):
            if self.op in _NUMBER_ONLY:
                raise ValueError(f"{self.op} does not apply to text")
        elif _is_number(self.value):
            if self.op in _TEXT_ONLY:
                raise ValueError(f"{self.op} applies to text only")
            if not _finite(self.value):
                raise ValueError(f"a filter value is a finite number, not {self.value}")
        else:
            raise ValueError(f"a filter value is a number or text, not {self.value!r}")

    def matches(self, properties: Mapping[str, Any]) -> bool:
        try:
            have = properties[self.key]
        except KeyError:
            return False
        want, op = self.value, self.op
        if isinstance(want, str):
            if not isinstance(have, str):
                return False
            if op is Op.EQ:
                return have == want
            if op is Op.NE:
                return have != want
            if op is Op.LT:
                return have.startswith(want)
            if op is Op.GT:
                return have.endswith(want)
            if op is Op.CONTAINS:
                return want in have
            return want not in have  # EXCLUDES
        if not _is_number(have):
            return False
        if op is Op.EQ:
            return bool(have == want)
        if op is Op.NE:
            return bool(have != want)
        if op is Op.LT:
            return bool(have < want)
        if op is Op.LE:
            return bool(have <= want)
        if op is Op.GT:
            return bool(have > want)
        return bool(have >= want)  # GE


def matches_all(filters: Iterable[Filter], properties: Mapping[str, Any] | None) -> bool:
    """Whether every filter matches (filters are ANDed; no filters match everything)."""
    props = properties or {}
    return all(f.matches(props) for f in filters)


# -- the index ----------------------------------------------------------------------------------

Item = TypeVar("Item")  # hashable: items are dict keys


@define(eq=False)
class _FilterSet(Generic[Item]):
    """The subscribers sharing one set of filters, and where the set is filed."""

    filters: tuple[Filter, ...]
    members: dict[Item, None] = field(factory=dict)


@define(eq=False)
class _Bounds(Generic[Item]):
    """Numeric bounds of one property and operator, sorted: ``values[i]`` is the bound of
    ``sets[i]``."""

    values: list[Number] = field(factory=list)
    sets: list[_FilterSet[Item]] = field(factory=list)

    def add(self, value: Number, filter_set: _FilterSet[Item]) -> None:
        i = bisect_right(self.values, value)
        self.values.insert(i, value)
        self.sets.insert(i, filter_set)

    def remove(self, value: Number, filter_set: _FilterSet[Item]) -> None:
        i = bisect_left(self.values, value)
        while self.sets[i] is not filter_set:
            i += 1
        del self.values[i], self.sets[i]


@define(eq=False)
class _Affixes(Generic[Item]):
    """Text prefixes (or suffixes) of one property: the sets filed under each, and how many
    distinct texts there are of each length, so that a value is tried at those lengths
    only."""

    suffix: bool
    texts: dict[str, dict[_FilterSet[Item], None]] = field(factory=dict)
    _length_counts: dict[int, int] = field(factory=dict)
    _lengths: list[int] = field(factory=list)

    def put(self, text: str, filter_set: _FilterSet[Item], add: bool) -> None:
        bucket = self.texts.get(text)
        if bucket is None:
            bucket = self.texts[text] = {}
            self._count(len(text), +1)
        _put(bucket, filter_set, add)
        if not bucket:
            del self.texts[text]
            self._count(len(text), -1)

    def _count(self, length: int, change: int) -> None:
        count = self._length_counts.get(length, 0) + change
        if count:
            self._length_counts[length] = count
        else:
            del self._length_counts[length]
        self._lengths = sorted(self._length_counts)

    def candidates(self, value: str) -> Iterable[_FilterSet[Item]]:
        """The sets filed under a text that ``value`` starts (ends) with."""
        size, texts = len(value), self.texts
        for n in self._lengths:
            if n > size:
                break
            bucket = texts.get(value[size - n :] if self.suffix else value[:n])
            if bucket:
                yield from bucket


@define
class FilterIndex(Generic[Item]):
    """Items (subscribers) each with one tuple of filters; :meth:`match` gives the items
    whose filters all match a message's properties."""

    _by_filters: dict[frozenset[Filter], _FilterSet[Item]] = field(factory=dict)
    _of_item: dict[Item, _FilterSet[Item]] = field(factory=dict)
    #: sets without filters: they match every message
    _everything: dict[_FilterSet[Item], None] = field(factory=dict)
    #: key -> value -> sets filed under ``key = value``
    _equal: dict[str, dict[Value, dict[_FilterSet[Item], None]]] = field(factory=dict)
    #: key -> the sets filed under ``key < prefix`` (``key > suffix``), text
    _prefix: dict[str, _Affixes[Item]] = field(factory=dict)
    _suffix: dict[str, _Affixes[Item]] = field(factory=dict)
    #: key -> operator -> numeric bounds
    _bounds: dict[str, dict[Op, _Bounds[Item]]] = field(factory=dict)
    #: key -> sets filed under a filter that needs checking whenever ``key`` is present
    _present: dict[str, dict[_FilterSet[Item], None]] = field(factory=dict)

    def __len__(self) -> int:
        return len(self._of_item)

    def __contains__(self, item: object) -> bool:
        return item in self._of_item

    def __iter__(self) -> Iterator[Item]:
        return iter(self._of_item)

    def filters_of(self, item: Item) -> tuple[Filter, ...]:
        return self._of_item[item].filters

    def add(self, item: Item, filters: Iterable[Filter] = ()) -> None:
        """File ``item`` under ``filters`` (replacing what it had)."""
        if item in self._of_item:
            self.remove(item)
        filters = tuple(filters)
        key = frozenset(filters)
        filter_set = self._by_filters.get(key)
        if filter_set is None:
            filter_set = self._by_filters[key] = _FilterSet(filters)
            self._file(filter_set, add=True)
        filter_set.members[item] = None
        self._of_item[item] = filter_set

    def remove(self, item: Item) -> None:
        """Forget ``item``; KeyError if it is not there."""
        filter_set = self._of_item.pop(item)
        del filter_set.members[item]
        if not filter_set.members:
            del self._by_filters[frozenset(filter_set.filters)]
            self._file(filter_set, add=False)

    def match(self, properties: Mapping[str, Any] | None) -> list[Item]:
        """The items whose filters all match ``properties`` (``None``: no properties)."""
        out: list[Item] = []
        for filter_set in self._everything:
            out.extend(filter_set.members)
        if not properties:
            return out
        for key, value in properties.items():
            for filter_set in self._candidates(key, value):
                if all(f.matches(properties) for f in filter_set.filters):
                    out.extend(filter_set.members)
        return out

    def _candidates(self, key: str, value: Any) -> Iterable[_FilterSet[Item]]:
        """The sets filed under a filter on ``key`` that ``value`` satisfies (each set is
        filed under exactly one filter, so no set comes twice for one message)."""
        equal = self._equal.get(key)
        if equal is not None:
            found = equal.get(value)
            if found:
                yield from found
        if isinstance(value, str):
            for table in (self._prefix, self._suffix):
                affixes = table.get(key)
                if affixes is not None:
                    yield from affixes.candidates(value)
        elif _is_number(value):
            bounds = self._bounds.get(key)
            if bounds:
                yield from _within(bounds, value)
        present = self._present.get(key)
        if present:
            yield from present

    def _file(self, filter_set: _FilterSet[Item], add: bool) -> None:
        """File ``filter_set`` under its most selective filter (or take it out again)."""
        filters = filter_set.filters
        if not filters:
            _put(self._everything, filter_set, add)
            return
        anchor = _anchor(filters)
        key, op, value = anchor.key, anchor.op, anchor.value
        if op is Op.EQ:
            _put(self._equal.setdefault(key, {}).setdefault(value, {}), filter_set, add)
            _prune(self._equal, key, value)
        elif isinstance(value, str) and op in (Op.LT, Op.GT):
            table = self._prefix if op is Op.LT else self._suffix
            affixes = table.get(key)
            if affixes is None:
                affixes = table[key] = _Affixes(suffix=op is Op.GT)
            affixes.put(value, filter_set, add)
            if not affixes.texts:
                del table[key]
        elif op in (Op.LT, Op.LE, Op.GT, Op.GE):
            bounds = self._bounds.setdefault(key, {}).setdefault(op, _Bounds())
            if add:
                bounds.add(value, filter_set)  # type: ignore[arg-type]
            else:
                bounds.remove(value, filter_set)  # type: ignore[arg-type]
                if not bounds.values:
                    del self._bounds[key][op]
                    if not self._bounds[key]:
                        del self._bounds[key]
        else:  # != and the text-only ones: a candidate whenever the property is there
            _put(self._present.setdefault(key, {}), filter_set, add)
            if not self._present[key]:
                del self._present[key]


def _anchor(filters: tuple[Filter, ...]) -> Filter:
    """The filter to file a set under: an equality, else a text prefix or suffix, else a
    numeric bound, else any (those are checked whenever their property is present)."""

    def rank(f: Filter) -> int:
        if f.op is Op.EQ:
            return 0
        if isinstance(f.value, str) and f.op in (Op.LT, Op.GT):
            return 1
        if f.op in (Op.LT, Op.LE, Op.GT, Op.GE):
            return 2
        return 3

    return min(filters, key=rank)


def _put(bucket: dict[Any, None], filter_set: Any, add: bool) -> None:
    if add:
        bucket[filter_set] = None
    else:
        del bucket[filter_set]


def _prune(table: dict[str, dict[Any, dict[Any, None]]], key: str, value: Any) -> None:
    if not table[key][value]:
        del table[key][value]
        if not table[key]:
            del table[key]


def _within(bounds: Mapping[Op, _Bounds[Any]], value: Number) -> Iterable[_FilterSet[Any]]:
    """The sets whose bound ``value`` satisfies: for ``key > t``, every t below value..."""
    for op, sorted_bounds in bounds.items():
        values, sets = sorted_bounds.values, sorted_bounds.sets
        if op is Op.GT:  # value > t
            yield from sets[: bisect_left(values, value)]
        elif op is Op.GE:  # value >= t
            yield from sets[: bisect_right(values, value)]
        elif op is Op.LT:  # value < t
            yield from sets[bisect_right(values, value) :]
        else:  # LE: value <= t
            yield from sets[bisect_left(values, value) :]
