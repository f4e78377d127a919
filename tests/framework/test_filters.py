"""Property filters (framework/filters.py): what each operator means, and FilterIndex, which
must give exactly what checking every subscription would, while checking only candidates."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgbroker.filters import Filter, FilterIndex, Op, matches_all

PROPS = {"n": 5, "d": Decimal("1413198000.5"), "t": "hello world"}


@pytest.mark.parametrize(
    ("key", "op", "value", "expected"),
    [
        ("n", "=", 5, True),
        ("n", "=", Decimal("5.0"), True),  # N and D compare as numbers
        ("n", "!=", 5, False),
        ("n", "<", 6, True),
        ("n", "<", 5, False),
        ("n", "<=", 5, True),
        ("n", ">", 4, True),
        ("n", ">", 5, False),
        ("n", ">=", 5, True),
        ("d", ">", 1413198000, True),
        ("d", "<", Decimal("1413198000.6"), True),
        ("t", "=", "hello world", True),
        ("t", "!=", "hello", True),
        ("t", "<", "hello", True),  # starts with
        ("t", "<", "world", False),
        ("t", ">", "world", True),  # ends with
        ("t", ">", "hello", False),
        ("t", "&", "o w", True),  # contains
        ("t", "&", "xyz", False),
        ("t", "~", "xyz", True),  # does not contain
        ("t", "~", "o", False),
        # a missing property never matches, whatever the operator
        ("missing", "!=", 1, False),
        ("missing", "~", "x", False),
        # nor does a property of the other type
        ("t", "!=", 5, False),
        ("n", "!=", "5", False),
    ],
)
def test_what_each_operator_means(key, op, value, expected):
    assert Filter(key, op, value).matches(PROPS) is expected


@pytest.mark.parametrize(
    ("op", "value"),
    [("<=", "text"), (">=", "text"), ("&", 1), ("~", Decimal(2)), ("=", float("nan")),
     ("=", Decimal("Infinity")), ("=", b"bytes"), ("=", True), ("?", 1)],
)  # fmt: skip
def test_operators_that_do_not_apply_are_refused(op, value):
    with pytest.raises(ValueError):
        Filter("k", op, value)


def test_filters_are_anded_and_none_match_everything():
    assert matches_all([], None)
    assert matches_all([Filter("n", ">", 1), Filter("t", "<", "he")], PROPS)
    assert not matches_all([Filter("n", ">", 1), Filter("t", "<", "x")], PROPS)
    assert not matches_all([Filter("n", ">", 1)], None)


# -- the index against checking everything ------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
NUMBERS = st.one_of(st.integers(-3, 3), st.decimals(-3, 3, places=1))
TEXTS = st.text(alphabet="xyz", max_size=3)
FILTERS = st.one_of(
    st.builds(Filter, KEYS, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), NUMBERS),
    st.builds(Filter, KEYS, st.sampled_from(["=", "!=", "<", ">", "&", "~"]), TEXTS),
)
PROPERTIES = st.dictionaries(KEYS, st.one_of(NUMBERS, TEXTS), max_size=3)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.integers(0, 15), st.lists(FILTERS, max_size=3)), max_size=20),
    st.lists(st.integers(0, 15), max_size=8),
    st.lists(PROPERTIES, min_size=1, max_size=5),
)
def test_the_index_matches_exactly_what_checking_every_subscription_matches(
    subscriptions, removals, messages
):
    index: FilterIndex[int] = FilterIndex()
    current: dict[int, list[Filter]] = {}
    for item, filters in subscriptions:
        index.add(item, filters)  # a second add replaces the first
        current[item] = filters
    for item in removals:
        if item in current:
            index.remove(item)
            del current[item]
    assert len(index) == len(current)
    for properties in messages:
        want = {i for i, filters in current.items() if matches_all(filters, properties)}
        got = index.match(properties)
        assert len(got) == len(set(got))  # nobody twice
        assert set(got) == want


def test_emptied_index_files_nothing():
    index: FilterIndex[str] = FilterIndex()
    for i, f in enumerate([Filter("a", "=", 1), Filter("a", "<", "x"), Filter("a", ">", 2),
                           Filter("a", ">", "y"), Filter("a", "!=", 1)]):  # fmt: skip
        index.add(f"s{i}", [f])
    index.add("plain")
    for i in range(5):
        index.remove(f"s{i}")
    index.remove("plain")
    assert index == FilterIndex()


def test_a_publish_checks_only_the_subscriptions_that_could_match(monkeypatch):
    """1,000 subscriptions, each for another value (or prefix, or bound): a message checks
    the one or few the index turns up, not all of them."""
    index: FilterIndex[int] = FilterIndex()
    for i in range(1000):
        index.add(i, [Filter("user", "=", i), Filter("kind", "=", "x")])
        index.add(1000 + i, [Filter("path", "<", f"/{i}/")])
        index.add(2000 + i, [Filter("size", ">", i * 10)])
    checked = []
    matches = Filter.matches
    monkeypatch.setattr(Filter, "matches", lambda self, p: checked.append(self) or matches(self, p))
    assert index.match({"user": 7, "kind": "x"}) == [7]
    assert len(checked) == 2  # the two filters of subscription 7
    checked.clear()
    assert index.match({"path": "/42/file"}) == [1042]
    assert len(checked) == 1
    checked.clear()
    assert sorted(index.match({"size": 25})) == [2000, 2001, 2002]
    assert len(checked) == 3  # only those whose bound is below 25


def test_subscriptions_with_the_same_filters_share_one_entry():
    index: FilterIndex[str] = FilterIndex()
    same = [Filter("a", "=", 1), Filter("b", "<", "x")]
    index.add("s1", same)
    index.add("s2", list(reversed(same)))  # the order of filters does not matter
    assert index.match({"a": 1, "b": "xy"}) == ["s1", "s2"]
    assert set(index.filters_of("s2")) == set(same)
    index.remove("s1")
    assert index.match({"a": 1, "b": "xy"}) == ["s2"]
    assert Op("<=") is Op.LE


@pytest.mark.parametrize(
    ("filters", "properties", "expected"),
    [
        ([Filter("t", ">", "ld")], {"t": "world"}, True),  # filed as a suffix
        ([Filter("t", ">", "wor")], {"t": "world"}, False),
        ([Filter("t", "<", "wor")], {"t": "world"}, True),  # filed as a prefix
        ([Filter("t", "<", "ld")], {"t": "world"}, False),
        ([Filter("t", "<", "")], {"t": "world"}, True),  # the empty prefix
        ([Filter("n", ">", 3)], {"n": 3}, False),  # a bound, at the bound
        ([Filter("n", ">=", 3)], {"n": 3}, True),
        ([Filter("n", "<", 3)], {"n": 3}, False),
        ([Filter("n", "<=", 3)], {"n": 3}, True),
        ([Filter("n", "!=", 3)], {"n": 4}, True),  # checked whenever "n" is there
        ([Filter("t", "~", "q")], {"t": "world"}, True),
    ],
)
def test_each_way_of_filing_finds_its_subscription(filters, properties, expected):
    index: FilterIndex[str] = FilterIndex()
    index.add("s", filters)
    index.add("other", [Filter("unrelated", "=", 0)])
    assert index.match(properties) == (["s"] if expected else [])
