"""Micromessage2 text inside frames: URL encoding, typed properties and commands."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
    Command,
    datetime_to_epoch,
    encode_command,
    encode_properties,
    encode_value,
    epoch_to_datetime,
    parse_command,
    parse_properties,
    parse_value,
    urldecode,
    urlencode,
)

# -- URL encoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("", ""),
        ("AZaz09-_.~", "AZaz09-_.~"),
        ("a b", "a%20b"),
        ("a+b", "a%2Bb"),
        ('Hello "world"', "Hello%20%22world%22"),
        ("topic/domain-events", "topic%2Fdomain-events"),
        ("%;,=:&<>!*'()", "%25%3B%2C%3D%3A%26%3C%3E%21%2A%27%28%29"),
        ("é€😀", "%C3%A9%E2%82%AC%F0%9F%98%80"),
        ("\x00\n", "%00%0A"),
    ],
)
def test_url_encoding_escapes_all_but_the_rfc3986_unreserved_in_upper_case_hex(text, encoded):
    assert urlencode(text) == encoded
    assert urldecode(encoded) == text


@pytest.mark.parametrize(
    ("encoded", "text"),
    [
        ("a+b", "a+b"),  # + is a plus, never a space
        ("%c3%a9", "é"),  # lower-case hex is read
        ("a b", "a b"),  # unescaped but printable: read leniently
        ('"/:', '"/:'),
    ],
)
def test_url_decoding_is_lenient_with_printable_characters(encoded, text):
    assert urldecode(encoded) == text


@pytest.mark.parametrize(
    "encoded",
    ["%", "%2", "a%g0", "%%", "100%", "%FF", "%C3", "%ED%A0%80", "a\nb", "\x7f", "é", "\x00"],
)
def test_url_decoding_rejects_malformed_escapes_controls_and_non_utf8(encoded):
    with pytest.raises(RemoteProtocolError):
        urldecode(encoded)


def test_url_encoding_a_lone_surrogate_is_a_value_error():
    with pytest.raises(ValueError):  # UnicodeEncodeError
        urlencode("\ud800")


# -- typed values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("N1", 1),
        ("N0", 0),
        ("N-42", -42),
        ("N007", 7),
        ("N9223372036854775807", 2**63 - 1),
        ("N-9223372036854775808", -(2**63)),
        ("D1413198000.0", Decimal("1413198000.0")),
        ("D1413198000", Decimal(1413198000)),
        ("D-1.5", Decimal("-1.5")),
        ("D0.000000001", Decimal("1E-9")),
        ("THello%20%22world%22", 'Hello "world"'),
        ("T", ""),
        ("TN1", "N1"),
    ],
)
def test_typed_values_parse(text, value):
    parsed = parse_value(text)
    assert parsed == value
    assert type(parsed) is type(value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "N",
        "N+1",
        "N1.5",
        "N 1",
        "N9223372036854775808",
        "N-9223372036854775809",
        "N" + "9" * 5000,  # never reaches int(): no digit-limit ValueError
        "N\u0661",  # ARABIC-INDIC DIGIT ONE: a digit of another script
        "D",
        "D.5",
        "D1.",
        "D1e5",
        "DNaN",
        "D1,5",
        "T%",
        "T%FF",
        "X1",
        "n1",
        "1",
    ],
)
def test_bad_typed_values_are_protocol_errors(text):
    with pytest.raises(RemoteProtocolError):
        parse_value(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42, "N42"),
        (-(2**63), "N-9223372036854775808"),
        (Decimal("1413198000.0"), "D1413198000.0"),
        (Decimal("1E+3"), "D1000"),
        (Decimal("1E-9"), "D0.000000001"),
        ('Hello "world"', "THello%20%22world%22"),
        (datetime(2014, 10, 13, 12, 0, tzinfo=timezone(timedelta(hours=1))), "D1413198000"),
        (datetime(1970, 1, 1, 0, 0, 0, 500, tzinfo=UTC), "D0.0005"),
        (datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC), "D-0.5"),
    ],
)
def test_typed_values_encode(value, text):
    assert encode_value(value) == text


def test_a_date_keeps_its_digits_exactly_which_a_float_would_not():
    """D is a Decimal: every digit the peer wrote survives decode and encode (a float has
    ~16 significant digits, and 1413198000.123456789 needs 19)."""
    text = "D1413198000.123456789"
    assert encode_value(parse_value(text)) == text
    assert float(text[1:]) != parse_value(text)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (2**63, ValueError),
        (Decimal("NaN"), ValueError),
        (Decimal("Infinity"), ValueError),
        (datetime(2014, 1, 1), ValueError),  # naive: which epoch?
        ("\udc80", ValueError),
        (True, TypeError),
        (1.5, TypeError),
        (None, TypeError),
    ],
)
def test_values_that_have_no_typed_form_are_refused(value, error):
    with pytest.raises(error):
        encode_value(value)


def test_epoch_and_datetime_convert_both_ways():
    assert epoch_to_datetime(Decimal("1413198000.0")) == datetime(2014, 10, 13, 11, tzinfo=UTC)
    moment = datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
    assert epoch_to_datetime(datetime_to_epoch(moment)) == moment
    assert datetime_to_epoch(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)) == -1


# -- properties ---------------------------------------------------------------------------------


V7_PROPS = b"user-id:N42;name:THello%20%22world%22;created:D1413198000.0;"


def test_properties_parse_in_order_with_their_types():
    assert parse_properties(V7_PROPS) == (
        ("user-id", 42),
        ("name", 'Hello "world"'),
        ("created", Decimal("1413198000.0")),
    )


def test_properties_encode_each_pair_ending_in_a_semicolon():
    props = {"user-id": 42, "name": 'Hello "world"', "created": Decimal("1413198000.0")}
    assert encode_properties(props) == V7_PROPS
    assert encode_properties(tuple(props.items())) == V7_PROPS
    assert encode_properties({}) == b""


@pytest.mark.parametrize(
    ("data", "props"),
    [
        (b"", ()),
        (b"k:N1", (("k", 1),)),  # the last ";" may be missing
        (b";;k:N1;;", (("k", 1),)),  # empty items are skipped
        (b"last_name:kalle;", (("last_name", "kalle"),)),  # V8: untyped text, "_" in the key
        (b"UserId:N5;", (("UserId", 5),)),
        (b"k:;", (("k", ""),)),
        (b"k:a%20b;", (("k", "a b"),)),
        (b"k:a:b;", (("k", "a:b"),)),  # the key ends at the first ":"
        (b"k:T:x;", (("k", ":x"),)),
    ],
)
def test_properties_are_read_leniently(data, props):
    assert parse_properties(data) == props


@pytest.mark.parametrize(
    "data",
    [
        b"k",  # no ":"
        b":N1;",
        b"k-\xc3\xa9:N1;",
        b"k:T\xc3\xa9;",  # raw non-ASCII
        b"a b:N1;",
        b"k:N1;k:N2;",  # which one would a filter see?
        b"k:Nx;",
        b"k:Dave;",  # an untyped value starting with a type letter must be of that type
        b"k:T%;",
        b"k:x%zz;",
    ],
)
def test_bad_properties_are_protocol_errors(data):
    with pytest.raises(RemoteProtocolError):
        parse_properties(data)


@pytest.mark.parametrize("props", [{"last_name": "x"}, {"Key": 1}, {"": 1}, (("k", 1), ("k", 2))])
def test_properties_are_only_written_with_field_keys_once_each(props):
    with pytest.raises(ValueError):  # the messages differ
        encode_properties(props)


# -- commands -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "command"),
    [
        (b"ping", Command("ping")),
        (b"ping;", Command("ping")),
        (b"sub;a=1,b=x%20y", Command("sub", (("a", "1"), ("b", "x y")))),
        (b"sub;f=1,f=2", Command("sub", (("f", "1"), ("f", "2")))),
        (b"sub;,a=1,,", Command("sub", (("a", "1"),))),
        (b"sub;a=", Command("sub", (("a", ""),))),
        (b"sub;a=b=c", Command("sub", (("a", "b=c"),))),
    ],
)
def test_commands_parse_into_a_name_and_ordered_arguments(data, command):
    assert parse_command(data) == command


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b";a=1",
        b"Sub;a=1",
        b"sub x",
        b"sub;a",
        b"sub;A=1",
        b"sub;a=%",
        b"s\xc3\xa9",
        b"sub;a=\x01",
    ],
)
def test_bad_commands_are_protocol_errors(data):
    with pytest.raises(RemoteProtocolError):
        parse_command(data)


def test_commands_encode_with_url_encoded_values():
    command = Command("subscribe", [("destination", "a/b c"), ("filter", "k=N1")])
    assert encode_command(command) == b"subscribe;destination=a%2Fb%20c,filter=k%3DN1"
    assert encode_command(Command("ping")) == b"ping"
    assert parse_command(encode_command(command)) == command


def test_command_arguments_by_key():
    command = Command("c", {"a": "1"})
    assert command.args == (("a", "1"),)
    command = Command("c", (("f", "1"), ("g", "2"), ("f", "3")))
    assert command.get("f") == "1"
    assert command.get("z") is None
    assert command.get("z", "d") == "d"
    assert command.get_all("f") == ["1", "3"]
    assert command.get_all("z") == []


@pytest.mark.parametrize("command", [Command("Sub"), Command(""), Command("c", {"A": "1"})])
def test_commands_with_names_or_keys_that_are_not_fields_cannot_be_written(command):
    with pytest.raises(ValueError, match="FIELD"):
        encode_command(command)
