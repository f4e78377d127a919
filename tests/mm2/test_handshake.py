"""The Micromessage2 handshake: messages, extension lists, version negotiation and the
active extensions, as docs/mm2.md ("Decisions") fixes them (the spec's examples where they
agree)."""

from __future__ import annotations

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import (
    ActiveExtensions,
    ErrorFrame,
    Extension,
    ExtensionFrame,
    Handshake,
    HandshakeDecoder,
    MessageFrame,
    UnsupportedExtensions,
    active_extensions,
    batch_ack_max_count,
    check_confirm,
    check_required,
    encode_extension_list,
    encode_frame,
    encode_handshake,
    negotiate_minor,
    parse_extension_list,
    unsupported_required,
)
from tests.mm2.support import decode_handshake

# -- extension lists ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "extensions"),
    [
        ("", ()),
        ("json", (Extension("json"),)),
        ("json;xml;protobuf", (Extension("json"), Extension("xml"), Extension("protobuf"))),
        ("json;xml;protobuf;", (Extension("json"), Extension("xml"), Extension("protobuf"))),
        (";;json;;dotnet;", (Extension("json"), Extension("dotnet"))),
        (
            "batch-ack:max-count=10;json;microauth",
            (
                Extension("batch-ack", {"max-count": "10"}),
                Extension("json"),
                Extension("microauth"),
            ),
        ),
        (
            "x-auth:user=hulk%20smash,realm=a%3Bb",
            (Extension("x-auth", (("user", "hulk smash"), ("realm", "a;b"))),),
        ),
        ("json:", (Extension("json"),)),
        ("json:,,a=1,", (Extension("json", {"a": "1"}),)),
        ("a:k=", (Extension("a", {"k": ""}),)),
    ],
)
def test_extension_lists_parse_into_names_and_ordered_properties(text, extensions):
    assert parse_extension_list(text) == extensions


def test_the_spec_batch_ack_spelling_max_count_colon_is_read_as_a_property():
    (ext,) = parse_extension_list("batch-ack:max-count:100;")
    assert ext == Extension("batch-ack", {"max-count": "100"})
    assert batch_ack_max_count(ext) == 100


@pytest.mark.parametrize(
    "text",
    [
        "Json",  # names are [a-z0-9-]+ (the spec's own "extensionName1" is not)
        "extensionName1:propName1=propValue2",
        "json dotnet",
        " json",
        "json;json",
        "a:k=1,k=2",
        "a:flag",  # a property needs a value
        "a:K=1",
        "a:k=%zz",
        "a:k=%FF",  # not UTF-8
        ":k=1",
        "x_foo",
    ],
)
def test_bad_extension_lists_are_protocol_errors(text):
    with pytest.raises(RemoteProtocolError):
        parse_extension_list(text)


def test_extension_lists_are_written_back_with_url_encoded_values():
    extensions = (Extension("batch-ack", {"max-count": "10"}), Extension("x-a", {"k": "a b,c"}))
    text = encode_extension_list(extensions)
    assert text == "batch-ack:max-count=10;x-a:k=a%20b%2Cc"
    assert parse_extension_list(text) == extensions


@pytest.mark.parametrize("extension", [Extension("Json"), Extension("a", {"K": "1"})])
def test_extension_names_and_keys_that_are_not_fields_cannot_be_written(extension):
    with pytest.raises(ValueError, match="FIELD"):
        encode_extension_list([extension])


def test_vendor_extensions_start_with_x():
    assert Extension("x-foo").vendor
    assert not Extension("json").vendor


def test_extension_get_reads_a_property_or_the_default():
    ext = Extension("a", {"k": "v"})
    assert ext.get("k") == "v"
    assert ext.get("z") is None
    assert ext.get("z", "d") == "d"


# -- handshake messages -------------------------------------------------------------------------


def test_handshake_defaults_are_major_1_minor_1_flags_0():
    assert encode_handshake(Handshake("id"))[:3] == b"\x01\x01\x00"


def test_handshake_lists_accept_plain_names():
    assert Handshake("a", ["json"], ["x"]).required == (Extension("json"),)


def test_bytes_after_the_handshake_are_trailing_data():
    after = encode_frame(MessageFrame(1, "t", b"x"))
    data = encode_handshake(Handshake("hulk", ["json"])) + after
    assert decode_handshake(data) == (Handshake("hulk", ["json"]), False, after)


def test_reserved_flags_are_read_and_kept():
    data = encode_handshake(Handshake("a", flags=0x80))
    assert decode_handshake(data)[0].flags == 0x80


def test_identity_of_255_characters_and_empty_lists():
    handshake = Handshake("i" * 255)
    assert decode_handshake(encode_handshake(handshake))[0] == handshake


def test_an_error_frame_instead_of_a_handshake_keeps_what_follows():
    data = encode_frame(ErrorFrame("go away")) + b"\x01\x02"
    assert decode_handshake(data) == (ErrorFrame("go away"), False, b"\x01\x02")


def test_a_large_error_frame_instead_of_a_handshake():
    error = ErrorFrame("x" * 300)
    assert decode_handshake(encode_frame(error)) == (error, False, b"")


@pytest.mark.parametrize(
    "data",
    [
        bytes([0x24, 1, 0x41]),  # 0x04 set with an unknown frame flag
        bytes([1, 1, 0, 1, 0xC3, 0, 0, 0, 0]),  # identity not ASCII
        bytes([1, 1, 0, 1, 0x07, 0, 0, 0, 0]),  # identity with a control character
        bytes([1, 1, 0, 0, 0, 4]) + b"JSON" + b"\x00\x00",
        bytes([1, 1, 0, 0, 0, 0, 0, 2, 0xFF, 0x41]),  # optional list not ASCII
    ],
)
def test_bad_handshakes_are_protocol_errors(data):
    assert decode_handshake(data) == (None, True, None)


def test_a_bad_list_is_refused_before_the_rest_arrives():
    decoder = HandshakeDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(bytes([1, 1, 0, 0, 0, 1]) + b"J")
    with pytest.raises(RemoteProtocolError):
        decoder.feed(b"\x00\x00")  # and it stays failed


def test_the_decoder_reads_one_message_only():
    decoder = HandshakeDecoder()
    assert decoder.feed(encode_handshake(Handshake("a"))) == Handshake("a")
    with pytest.raises(RuntimeError):
        decoder.feed(b"\x01")


@pytest.mark.parametrize(
    "handshake",
    [
        Handshake("a", major=4),  # bit 0x04: the peer would read an ERROR frame
        Handshake("a", minor=256),
        Handshake("a", flags=-1),
        Handshake("i" * 256),
        Handshake("é"),
        Handshake("a", [Extension("x" * 70000)]),
    ],
)
def test_handshakes_the_protocol_cannot_carry_are_value_errors(handshake):
    with pytest.raises(ValueError):  # the messages differ per field
        encode_handshake(handshake)


# -- negotiation --------------------------------------------------------------------------------


@pytest.mark.parametrize(("peer", "own", "used"), [(0, 1, 0), (1, 1, 1), (7, 1, 1), (3, 2, 2)])
def test_the_lower_minor_is_used(peer, own, used):
    assert negotiate_minor(Handshake("a", minor=peer), own) == used


@pytest.mark.parametrize("major", [0, 2, 3, 255])
def test_a_major_other_than_1_is_refused(major):
    with pytest.raises(RemoteProtocolError, match=f"major version {major}"):
        negotiate_minor(Handshake("a", major=major))


SERVER_SUPPORTS = {"json", "dotnet", "batch-ack", "ack", "pubsub"}


def test_the_spec_example_client_requires_a_b_server_requires_c():
    """Client: I require A, B and suggest X, Y. Server: I support A, B, but I also require
    C; I suggest Y like you but also Z. Client: I support C and we'll use Y and Z."""
    hello = Handshake("client", ["a", "b"], ["x", "y"])
    supported = {"a", "b", "c", "y", "z"}
    check_required(hello.required, supported)  # the server supports A and B
    reply = Handshake("server", ["c"], ["y", "z"])
    check_required(reply.required, {"a", "b", "c", "x", "y", "z"})  # the client supports C
    confirm = Handshake("client", ["a", "b", "c"], ["y", "z"])
    active = check_confirm(hello, reply, confirm, supported)
    assert active.names == ("a", "b", "c", "y", "z")
    assert [active.id_of(n) for n in "abcyz"] == [1, 2, 3, 4, 5]


def test_unsupported_required_extensions_are_named_in_list_order():
    required = parse_extension_list("json;x-foo;ack;x-bar")
    assert unsupported_required(required, SERVER_SUPPORTS) == ("x-foo", "x-bar")
    assert unsupported_required(required[:1], SERVER_SUPPORTS) == ()


def test_check_required_raises_with_the_error_frame_text_of_v14():
    with pytest.raises(UnsupportedExtensions) as caught:
        check_required([Extension("json"), Extension("x-foo")], SERVER_SUPPORTS)
    assert caught.value.names == ("x-foo",)
    assert str(caught.value) == "unsupported extensions: x-foo"
    assert isinstance(caught.value, RemoteProtocolError)


def test_active_extensions_are_the_step_3_lists_numbered_from_1():
    active = active_extensions(Handshake("a", ["json", "dotnet"], ["batch-ack"]))
    assert active == ActiveExtensions(
        (Extension("json"), Extension("dotnet"), Extension("batch-ack"))
    )
    assert active.get(3) == Extension("batch-ack")
    assert active.get(0) is None
    assert active.get(4) is None
    assert active.by_name("dotnet") == Extension("dotnet")
    assert active.by_name("ack") is None
    assert active.id_of("ack") is None
    assert "json" in active
    assert "ack" not in active


def test_no_extensions_is_an_empty_set():
    active = active_extensions(Handshake("a"))
    assert active.names == ()
    assert active.get(1) is None


def test_an_extension_in_both_step_3_lists_is_refused():
    with pytest.raises(RemoteProtocolError, match="both"):
        active_extensions(Handshake("a", ["json"], ["json"]))


def test_more_than_255_active_extensions_is_refused():
    names = [f"x-{i}" for i in range(256)]
    assert len(active_extensions(Handshake("a", names[:255])).names) == 255
    with pytest.raises(RemoteProtocolError, match="256"):
        active_extensions(Handshake("a", names))


HELLO = Handshake("hulk", ["json", "dotnet"])
REPLY = Handshake("server", ["pubsub"], ["batch-ack"])


def test_check_confirm_gives_the_active_extensions():
    confirm = Handshake("hulk", ["json", "dotnet", "pubsub"], ["batch-ack"])
    assert check_confirm(HELLO, REPLY, confirm, SERVER_SUPPORTS).id_of("batch-ack") == 4


def test_the_client_may_drop_its_own_required_extension_in_step_3():
    confirm = Handshake("hulk", ["pubsub"])
    assert check_confirm(HELLO, REPLY, confirm, SERVER_SUPPORTS).names == ("pubsub",)


@pytest.mark.parametrize(
    ("confirm", "match"),
    [
        (Handshake("hulk", ["json"]), "not confirmed: pubsub"),
        (Handshake("hulk", ["pubsub"], ["x-foo"]), "unsupported extensions: x-foo"),
        (Handshake("thor", ["pubsub"]), "identity"),
        (Handshake("hulk", ["pubsub"], major=2), "major"),
        (Handshake("hulk", ["pubsub"], ["pubsub"]), "both"),
    ],
)
def test_check_confirm_refuses_a_bad_step_3(confirm, match):
    with pytest.raises(RemoteProtocolError, match=match):
        check_confirm(HELLO, REPLY, confirm, SERVER_SUPPORTS)


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("batch-ack", 10),
        ("batch-ack:max-count=100", 100),
        ("batch-ack:count=5", 5),
        ("batch-ack:max-count:7", 7),
        ("batch-ack:max-count=3,count=9", 3),
        ("batch-ack:max-count=65535", 65535),
    ],
)
def test_batch_ack_window_reads_max_count_and_its_aliases(text, count):
    assert batch_ack_max_count(parse_extension_list(text)[0]) == count


@pytest.mark.parametrize("value", ["0", "65536", "-1", "ten", "", "1e3", " 5"])
def test_a_bad_batch_ack_window_is_a_protocol_error(value):
    with pytest.raises(RemoteProtocolError, match="max-count"):
        batch_ack_max_count(Extension("batch-ack", {"max-count": value}))


def test_an_ack_frame_carries_the_batch_ack_id_from_step_3():
    active = active_extensions(Handshake("hulk", ["json", "dotnet"], ["batch-ack"]))
    ack_id = active.id_of("batch-ack")
    assert encode_frame(ExtensionFrame(ack_id, (4).to_bytes(2, "big"))) == bytes.fromhex(
        "0203020004"
    )
