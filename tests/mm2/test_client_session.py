"""The Micromessage2 client's sans-IO session (:class:`ClientSession`): the handshake's step 3
and its refusals, sequence numbers and the ack window across the wrap, the acks the client
owes, ``json``, ``dotnet``, fragments, vendor extensions and what the server gets wrong."""

from __future__ import annotations

from decimal import Decimal

import pytest

from msgbroker.plugins.mm2.client import (
    Message,
    MM2ConnectionClosed,
    MM2Error,
    MM2HandshakeRefused,
    MM2ProtocolError,
    MM2ServerError,
)
from msgbroker.plugins.mm2.client_common import Acked, Closed, ExtensionReceived, Ready
from msgbroker.plugins.mm2.client_session import ClientSession
from msgbroker.plugins.mm2.codec import (
    Command,
    ErrorFrame,
    Extension,
    ExtensionFrame,
    FrameDecoder,
    Handshake,
    HandshakeDecoder,
    MessageFrame,
    ack_frame,
    encode_frame,
    encode_handshake,
)

V1 = bytes.fromhex("01 01 00 04 68 75 6c 6b 00 0b 6a 73 6f 6e 3b 64 6f 74 6e 65 74 00 00")
V2 = bytes.fromhex("01 01 00 06 73 65 72 76 65 72 00 00 00 09 62 61 74 63 68 2d 61 63 6b")
V3 = bytes.fromhex(
    "01 01 00 04 68 75 6c 6b 00 0b 6a 73 6f 6e 3b 64 6f 74 6e 65 74 00 16 62 61 74 63 68"
    " 2d 61 63 6b 3a 6d 61 78 2d 63 6f 75 6e 74 3d 31 30"
)
ALL = ("pubsub", "ack", "batch-ack", "json", "dotnet")


def handshake(session, reply):
    """Feed step 2; (events, the step 3 the client wrote, the frames written after it)."""
    session.data_to_send()
    events = session.receive(encode_handshake(reply))
    out = session.data_to_send()
    if session.ready:
        decoder = HandshakeDecoder()
        confirm = decoder.feed(out)
        return events, confirm, list(FrameDecoder().feed(decoder.trailing_data))
    return events, None, list(FrameDecoder().feed(out))


def ready_session(required=("pubsub",), optional=(), offered=ALL, **kw):
    session = ClientSession("alice", required, optional, **kw)
    handshake(session, Handshake("srv", (), offered))
    assert session.ready
    return session


def frames(session):
    return list(FrameDecoder().feed(session.data_to_send()))


def test_steps_1_and_3_are_the_spec_vectors_when_the_client_takes_the_servers_suggestion():
    session = ClientSession("hulk", ("json", "dotnet"), (), accept_suggested=True)
    assert session.data_to_send() == V1
    events = session.receive(V2)
    assert session.data_to_send() == V3  # batch-ack:max-count=10 as the third extension
    assert events == [Ready(session.server, session.active, 1)]
    assert session.active.names == ("json", "dotnet", "batch-ack")
    assert session.window == 10


def test_step_3_lists_client_then_server_required_and_only_optionals_both_offered():
    session = ClientSession("alice", ("json",), ("batch-ack", "dotnet", "x-only-mine"))
    reply = Handshake("srv", ("pubsub", "json"), ("dotnet", "ack", "batch-ack"))
    _, confirm, _ = handshake(session, reply)
    assert [e.name for e in confirm.required] == ["json", "pubsub"]
    assert [e.name for e in confirm.optional] == ["batch-ack", "dotnet"]  # client's order
    assert session.active.names == ("json", "pubsub", "batch-ack", "dotnet")
    assert session.active.id_of("dotnet") == 4  # ids follow step 3: required, then optional


def test_batch_ack_window_is_the_smaller_of_the_two_and_written_explicitly():
    session = ClientSession("alice", (), (Extension("batch-ack", {"max-count": "50"}),))
    _, confirm, _ = handshake(
        session, Handshake("srv", (), (Extension("batch-ack", {"count": "20"}),))
    )
    assert confirm.optional == (Extension("batch-ack", (("max-count", "20"),)),)
    assert session.window == 20


def test_ack_gives_a_window_of_one():
    session = ready_session(optional=("ack",))
    assert session.window == 1


def test_the_lower_minor_is_used_and_step_3_carries_it():
    session = ClientSession("alice")
    _, confirm, _ = handshake(session, Handshake("srv", (), (), minor=0))
    assert session.minor == 0 and confirm.minor == 0


def test_server_major_2_is_refused_with_an_error_frame():
    session = ClientSession("alice")
    events, confirm, written = handshake(session, Handshake("srv", ("pubsub",), (), major=2))
    assert confirm is None
    assert written == [ErrorFrame("unsupported major version 2 (only 1)")]
    (closed,) = events
    assert isinstance(closed.error, MM2HandshakeRefused)
    assert closed.error.major == 2
    assert session.state == "closed"


def test_a_required_extension_the_client_lacks_is_refused_naming_the_servers_list():
    session = ClientSession("alice")
    events, _, written = handshake(session, Handshake("srv", ("pubsub", "xml", "x-zip"), ()))
    assert written == [ErrorFrame("unsupported extensions: xml, x-zip")]
    error = events[0].error
    assert isinstance(error, MM2HandshakeRefused)
    assert error.server_required == ("pubsub", "xml", "x-zip")
    assert error.unsupported == ("xml", "x-zip")
    assert "pubsub;xml;x-zip" in str(error)


def test_a_vendor_extension_named_as_supported_is_accepted_and_its_frames_handed_over():
    session = ClientSession("alice", supported=("x-zip",))
    _, confirm, _ = handshake(session, Handshake("srv", ("x-zip",), ()))
    assert [e.name for e in confirm.required] == ["pubsub", "x-zip"]
    assert session.receive(encode_frame(ExtensionFrame(2, b"hi"))) == [
        ExtensionReceived(Extension("x-zip"), b"hi")
    ]
    session.send_extension("x-zip", b"yo")
    assert frames(session) == [ExtensionFrame(2, b"yo")]
    with pytest.raises(MM2Error, match="not active"):
        session.send_extension("x-other", b"")


def test_an_error_frame_instead_of_step_2_is_the_servers_refusal():
    session = ClientSession("alice")
    (closed,) = session.receive(encode_frame(ErrorFrame("go away")))
    assert isinstance(closed.error, MM2ServerError) and closed.error.text == "go away"
    assert session.data_to_send() == encode_handshake(session.hello)  # step 1 only


def test_bad_own_lists_are_value_errors():
    with pytest.raises(ValueError, match="both required and optional"):
        ClientSession("a", ("json",), ("json",))
    with pytest.raises(ValueError, match="twice"):
        ClientSession("a", ("json", "json"))
    with pytest.raises(ValueError, match="max-count"):
        ClientSession("a", (), ("batch-ack:max-count=0",))
    with pytest.raises(ValueError):
        ClientSession("a\n")


def test_sending_before_the_handshake_or_after_the_end_is_refused():
    session = ClientSession("alice")
    with pytest.raises(MM2Error, match="not complete"):
        session.prepare("t", b"x")
    session.lost()
    with pytest.raises(MM2ConnectionClosed):
        session.subscribe("t")


def test_sequence_numbers_and_the_window_across_the_wrap():
    session = ready_session(optional=("batch-ack",))
    message = session.prepare("t", b"x")
    sent = 0
    while sent < 65533:  # acknowledged 10 at a time, as a server would
        for _ in range(10 if 65533 - sent >= 10 else 65533 - sent):
            sent += 1
            assert session.send(message) == sent
        session.receive(encode_frame(ack_frame(2, sent)))
    session.data_to_send()
    assert [session.send(message) for _ in range(4)] == [65534, 65535, 1, 2]
    assert session.unacked == 4
    assert session.receive(encode_frame(ack_frame(2, 1))) == [Acked(3)]  # 65534, 65535, 1
    assert session.unacked == 1
    assert session.receive(encode_frame(ack_frame(2, 65535))) == [Acked(0)]  # stale
    assert session.receive(encode_frame(ack_frame(2, 2))) == [Acked(1)]
    assert session.unacked == 0


def test_a_full_window_stops_sending():
    session = ready_session(optional=("batch-ack:max-count=2",))
    message = session.prepare("t", b"x")
    session.send(message)
    session.send(message)
    assert not session.has_room
    with pytest.raises(RuntimeError, match="no room"):
        session.send(message)
    session.receive(encode_frame(ack_frame(2, 1)))
    assert session.has_room


def test_acks_owed_cover_the_handled_prefix_and_cross_the_wrap():
    session = ready_session(optional=("batch-ack",))
    data = b"".join(encode_frame(MessageFrame(s, "t", b"m")) for s in (65534, 65535, 1))
    assert [m.seq for m in session.receive(data)] == [65534, 65535, 1]
    session.data_to_send()
    session.done(65535)  # handled out of order: nothing is acknowledgeable yet
    assert session.handled == 0
    assert session.flush_acks() is None and session.data_to_send() == b""
    session.done(65534)
    session.done(1)
    assert session.handled == 3
    assert session.flush_acks() == 1  # one cumulative ack, across the wrap
    assert frames(session) == [ack_frame(session.active.id_of("batch-ack"), 1)]
    assert session.owed == 0


def test_no_acks_are_owed_without_an_ack_extension():
    session = ready_session()
    session.receive(encode_frame(MessageFrame(1, "t", b"m")))
    session.done(1)
    assert session.owed == 0 and session.flush_acks() is None


def test_received_messages_are_typed_values():
    session = ready_session()
    frame = MessageFrame(7, "@bob", b"hi", {"n": 5, "d": Decimal("1.5"), "t": "x y"})
    (message,) = session.receive(encode_frame(frame))
    assert message == Message(7, "@bob", b"hi", {"n": 5, "d": Decimal("1.5"), "t": "x y"})
    assert message.sender == "bob"


def test_json_serializes_values_and_checks_bytes_both_ways():
    session = ready_session(optional=("json",))
    session.send(session.prepare("t", {"a": [1, "é"]}))
    assert frames(session)[0].payload == '{"a":[1,"é"]}'.encode()
    session.send(session.prepare("t", b"[1]"))
    with pytest.raises(ValueError, match="not JSON"):
        session.prepare("t", b"{nope")
    (message,) = session.receive(encode_frame(MessageFrame(1, "t", b'{"k":true}')))
    assert message.value == {"k": True}
    session.data_to_send()
    events = session.receive(encode_frame(MessageFrame(2, "t", b"{nope")))
    assert isinstance(events[-1].error, MM2ProtocolError)
    assert isinstance(frames(session)[0], ErrorFrame)


def test_without_json_a_payload_is_bytes():
    session = ready_session()
    with pytest.raises(TypeError, match="bytes"):
        session.prepare("t", {"a": 1})


def test_dotnet_type_frames_only_when_the_type_changes_and_the_received_type_is_kept():
    session = ready_session(optional=("dotnet",))
    dotnet = session.active.id_of("dotnet")
    for type_name in ("A", "A", None, "B"):
        session.send(session.prepare("t", b"x", type_name=type_name))
    kinds = [(type(f).__name__, f.payload) for f in frames(session)]
    assert kinds == [
        ("ExtensionFrame", b"A"),
        ("MessageFrame", b"x"),
        ("MessageFrame", b"x"),
        ("MessageFrame", b"x"),
        ("ExtensionFrame", b"B"),
        ("MessageFrame", b"x"),
    ]
    data = encode_frame(ExtensionFrame(dotnet, b"My.Type, Asm")) + b"".join(
        encode_frame(MessageFrame(s, "t", b"m")) for s in (1, 2)
    )
    assert [m.type_name for m in session.receive(data)] == ["My.Type, Asm"] * 2


def test_a_type_name_needs_dotnet():
    session = ready_session()
    with pytest.raises(ValueError, match="dotnet"):
        session.prepare("t", b"x", type_name="T")


def test_large_payloads_go_in_fragments_and_come_back_whole():
    session = ready_session(optional=("batch-ack",), fragment_size=4)
    session.send(session.prepare("t", b"0123456789", {"k": 1}))
    parts = frames(session)
    assert [(f.payload, f.continued, bool(f.properties)) for f in parts] == [
        (b"0123", True, True),
        (b"4567", True, False),
        (b"89", False, False),
    ]
    assert session.unacked == 1  # one message, whatever its fragments
    (whole,) = session.receive(b"".join(encode_frame(f) for f in parts))
    assert whole.payload == b"0123456789" and whole.properties == {"k": 1}


def test_subscribe_writes_the_pubsub_command_and_needs_pubsub():
    session = ready_session()
    session.subscribe("news", queue="workers", filters=["price>=N10"])
    session.unsubscribe("news")
    assert frames(session) == [
        Command("subscribe", (("destination", "news"), ("queue", "workers"),
                              ("filter", "price>=N10"))),
        Command("unsubscribe", (("destination", "news"),)),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="bad filter"):
        session.subscribe("news", filters=["price"])
    bare = ready_session(required=(), offered=())
    with pytest.raises(MM2Error, match="pubsub"):
        bare.subscribe("news")


def test_an_extension_frame_with_no_active_id_is_a_protocol_error():
    session = ready_session()
    events = session.receive(encode_frame(ExtensionFrame(9, b"")))
    assert isinstance(events[-1], Closed) and isinstance(events[-1].error, MM2ProtocolError)
    assert "id 9" in frames(session)[0].text


def test_an_error_frame_after_the_handshake_ends_the_session_after_earlier_messages():
    session = ready_session()
    data = encode_frame(MessageFrame(1, "t", b"m")) + encode_frame(ErrorFrame("shutting down"))
    message, closed = session.receive(data)
    assert message.payload == b"m"
    assert closed.error.text == "shutting down"
    assert session.receive(encode_frame(MessageFrame(2, "t", b"m"))) == []
