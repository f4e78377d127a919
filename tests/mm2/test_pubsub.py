"""The Micromessage2 ``pubsub`` commands (our definition, docs/mm2.md) and their filters, read
and written (the hub evaluates them)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
    Command,
    Filter,
    Op,
    Subscribe,
    Unsubscribe,
    encode_command,
    encode_filter,
    encode_pubsub,
    parse_command,
    parse_filter,
    parse_pubsub,
)

# -- filters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("n=N1", Filter("n", Op.EQ, 1)),
        ("n!=N1", Filter("n", Op.NE, 1)),
        ("n<N1", Filter("n", Op.LT, 1)),
        ("n<=N1", Filter("n", Op.LE, 1)),
        ("n>N-1", Filter("n", Op.GT, -1)),
        ("n>=N1", Filter("n", Op.GE, 1)),
        ("d<=D1413198000.5", Filter("d", Op.LE, Decimal("1413198000.5"))),
        ("t=Ta", Filter("t", Op.EQ, "a")),
        ("t!=Ta", Filter("t", Op.NE, "a")),
        ("t<THel%20lo", Filter("t", Op.LT, "Hel lo")),
        ("t>Tlo", Filter("t", Op.GT, "lo")),
        ("t&Tell", Filter("t", Op.CONTAINS, "ell")),
        ("t~Tell", Filter("t", Op.EXCLUDES, "ell")),
        ("t=T", Filter("t", Op.EQ, "")),
        ("t=T%3D", Filter("t", Op.EQ, "=")),
        ("t<T=x", Filter("t", Op.LT, "=x")),  # "<" then a text starting "=" would need "<=T"
        ("last_name=Tkalle", Filter("last_name", Op.EQ, "kalle")),
    ],
)
def test_filters_parse_with_two_character_operators_first(text, parsed):
    assert parse_filter(text) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "",
        "n",
        "=N1",
        "n N1",
        "n=1",  # a value needs its type prefix
        "n==N1",
        "n<>N1",
        "n=!N1",
        "t<=Ta",  # text has no <= or >=
        "t>=Ta",
        "n&N1",  # numbers have no & or ~
        "d~D1",
        "n=Nx",
        "t=T%",
        "k y=N1",
    ],
)
def test_bad_filters_are_protocol_errors(text):
    with pytest.raises(RemoteProtocolError):
        parse_filter(text)


@pytest.mark.parametrize(
    "filter_",
    [
        Filter("n", Op.LE, 5),
        Filter("d", Op.GT, Decimal("1.25")),
        Filter("t", Op.CONTAINS, "a b;c,d=e"),
        Filter("last_name", Op.EQ, "kalle"),
    ],
)
def test_filters_round_trip(filter_):
    assert parse_filter(encode_filter(filter_)) == filter_


def test_filters_are_the_hubs_own_so_a_subscribe_reaches_it_as_it_is():
    from msgbroker import filters

    parsed = parse_filter("t&Tx")
    assert type(parsed) is filters.Filter
    assert parsed.op is filters.Op.CONTAINS
    assert parsed.matches({"t": "axb"})


def test_filter_keys_that_cannot_be_read_back_are_not_written():
    with pytest.raises(ValueError, match="filter key"):
        encode_filter(Filter("a b", Op.EQ, 1))


def test_a_float_filter_value_has_no_typed_form():
    with pytest.raises(TypeError, match="float"):
        encode_filter(Filter("n", Op.LT, 1.5))


# -- subscribe and unsubscribe ------------------------------------------------------------------


def test_subscribe_with_queue_and_repeated_filters():
    command = parse_command(
        b"subscribe;destination=orders%2Feu,queue=workers,filter=n%3E%3DN10,filter=t%26Tx"
    )
    assert parse_pubsub(command) == Subscribe(
        "orders/eu", "workers", (Filter("n", Op.GE, 10), Filter("t", Op.CONTAINS, "x"))
    )


def test_plain_subscribe_and_unsubscribe():
    assert parse_pubsub(Command("subscribe", {"destination": "a"})) == Subscribe("a")
    assert parse_pubsub(Command("unsubscribe", {"destination": "a"})) == Unsubscribe("a")


def test_other_commands_are_not_pubsub():
    assert parse_pubsub(Command("ping")) is None
    assert parse_pubsub(Command("x-subscribe", {"destination": "a"})) is None


@pytest.mark.parametrize(
    "args",
    [
        (),
        (("destination", ""),),
        (("destination", "a"), ("destination", "b")),
        (("destination", "a\n"),),
        (("destination", "x" * 256),),
        (("destination", "a"), ("queue", "")),
        (("destination", "a"), ("queue", "q"), ("queue", "r")),
        (("destination", "a"), ("filters", "n=N1")),  # a typo is not ignored
        (("destination", "a"), ("filter", "n<=T1")),
        (("destination", "a"), ("filter", "")),
    ],
)
def test_bad_subscribes_are_protocol_errors(args):
    with pytest.raises(RemoteProtocolError):
        parse_pubsub(Command("subscribe", args))


@pytest.mark.parametrize(
    "args",
    [(), (("destination", "a"), ("queue", "q")), (("destination", "a"), ("filter", "n=N1"))],
)
def test_unsubscribe_takes_a_destination_only(args):
    with pytest.raises(RemoteProtocolError):
        parse_pubsub(Command("unsubscribe", args))


@pytest.mark.parametrize(
    "request_",
    [
        Subscribe("a"),
        Subscribe("topic/x y", "group 1", (Filter("k", Op.NE, "a,b;c"), Filter("n", Op.LE, -3))),
        Unsubscribe("@hulk"),
    ],
)
def test_pubsub_requests_round_trip_through_the_wire(request_):
    command = encode_pubsub(request_)
    assert parse_pubsub(parse_command(encode_command(command))) == request_


@pytest.mark.parametrize(
    "request_",
    [Subscribe(""), Subscribe("é"), Subscribe("a", ""), Unsubscribe("a\n")],
)
def test_pubsub_requests_the_peer_would_reject_cannot_be_written(request_):
    with pytest.raises(ValueError):  # the messages differ
        encode_pubsub(request_)
