"""The Twisted Micromessage2 client (:class:`MM2ClientProtocol`) on a ``Clock`` and a
``StringTransport`` (:class:`~tests.mm2.client_support.Wire`), no sockets: the handshake,
its timeout and refusal, the publish queue behind the ack window and its timeout, auto-acks
(also after a Deferred, across the wrap), ERROR frames and close. The same client over real
sockets is in ``test_client_network.py``."""

from __future__ import annotations

import pytest
from twisted.internet import defer

from msgbroker.clientkit.testing import result
from msgbroker.plugins.mm2.client import (
    MM2ConnectionClosed,
    MM2HandshakeRefused,
    MM2ServerError,
    MM2Timeout,
)
from msgbroker.plugins.mm2.codec import (
    Command,
    ErrorFrame,
    Extension,
    Handshake,
    MessageFrame,
    ack_frame,
    encode_handshake,
)
from tests.mm2.client_support import Wire


def server(window=2):
    return Handshake("srv", (), ("pubsub", Extension("batch-ack", {"max-count": str(window)})))


def ready_wire(window=2, **options):
    wire = Wire(**options)
    wire.handshake(server(window))
    return wire


def test_step_1_on_connect_and_ready_after_step_3():
    wire = Wire()
    assert wire.hello == Handshake("alice", ("pubsub",), ("batch-ack",))
    ready = wire.proto.when_ready()
    assert not ready.called
    confirm = wire.handshake(server(5))
    assert confirm.optional == (Extension("batch-ack", {"max-count": "5"}),)
    assert result(ready).names == ("pubsub", "batch-ack")


def test_no_handshake_reply_times_out():
    wire = Wire(timeout=5)
    ready = wire.proto.when_ready()
    wire.clock.advance(4.9)
    assert not ready.called
    wire.clock.advance(0.2)
    with pytest.raises(MM2Timeout, match="no handshake reply within 5 s"):
        result(ready)
    assert wire.transport.disconnecting or wire.transport.disconnected


def test_a_refused_handshake_sends_an_error_fails_ready_and_closes():
    wire = Wire()
    ready = wire.proto.when_ready()
    wire.proto.dataReceived(encode_handshake(Handshake("srv", ("pubsub", "x-secret"), ())))
    assert wire.sent() == [ErrorFrame("unsupported extensions: x-secret")]
    with pytest.raises(MM2HandshakeRefused, match="requires pubsub;x-secret") as info:
        result(ready)
    assert info.value.unsupported == ("x-secret",)
    assert wire.closed


def test_publishes_beyond_the_window_wait_in_order_and_go_as_acks_come():
    wire = ready_wire(window=2)
    first, second, third = (wire.proto.publish("t", bytes([i])) for i in range(3))
    assert (result(first), result(second)) == (1, 2)
    assert not third.called and wire.proto.queued == 1
    assert [f.payload for f in wire.sent()] == [b"\x00", b"\x01"]
    wire.feed(ack_frame(2, 1))
    assert result(third) == 3
    assert wire.sent() == [MessageFrame(3, "t", b"\x02")]
    acked = wire.proto.when_acked()
    wire.feed(ack_frame(2, 3))
    assert result(acked) is None and wire.proto.unacked == 0


def test_a_publish_waiting_too_long_for_room_times_out_and_is_never_sent():
    wire = ready_wire(window=1)
    wire.proto.publish("t", b"a")
    late = wire.proto.publish("t", b"b", timeout=3)
    wire.sent()
    wire.clock.advance(3)
    with pytest.raises(MM2Timeout, match="within 3 s"):
        result(late)
    wire.feed(ack_frame(2, 1))
    assert wire.sent() == []
    assert result(wire.proto.publish("t", b"c")) == 2  # no gap in the numbers


def test_auto_ack_once_per_batch_of_input_and_across_the_wrap():
    got = []
    wire = ready_wire(on_message=got.append)
    wire.feed(MessageFrame(65535, "t", b"a"), MessageFrame(1, "t", b"b"))
    assert [m.seq for m in got] == [65535, 1]
    assert wire.sent() == [ack_frame(2, 1)]  # one cumulative ack for both


def test_a_deferred_from_the_handler_delays_its_ack_and_acks_stay_in_order():
    pending: list[defer.Deferred[None]] = []

    def handler(message):
        pending.append(defer.Deferred())
        return pending[-1]

    wire = ready_wire(on_message=handler)
    wire.feed(MessageFrame(1, "t", b"a"), MessageFrame(2, "t", b"b"))
    assert wire.sent() == []
    pending[1].callback(None)  # the second is done first: nothing to ack yet
    assert wire.sent() == []
    pending[0].errback(ValueError("handler failed"))  # logged, and acknowledged anyway
    assert wire.sent() == [ack_frame(2, 2)]


def test_a_raising_handler_is_logged_and_the_message_acknowledged():
    def handler(message):
        raise RuntimeError("boom")

    wire = ready_wire(on_message=handler)
    wire.feed(MessageFrame(1, "t", b"a"))
    assert wire.sent() == [ack_frame(2, 1)]


def test_without_auto_ack_the_application_acks():
    got = []
    wire = ready_wire(on_message=got.append, auto_ack=False)
    wire.feed(MessageFrame(1, "t", b"a"), MessageFrame(2, "t", b"b"))
    assert wire.sent() == []
    wire.proto.ack(got[1])
    assert wire.sent() == []  # the first is not handled yet
    wire.proto.ack(got[0])
    assert wire.sent() == [ack_frame(2, 2)]


def test_commands_before_ready_follow_step_3_and_publishes_after_them():
    wire = Wire()
    d = wire.proto.publish("t", b"early")
    wire.proto.subscribe("news", filters=["n=N1"])
    assert wire.transport.value() == b""
    wire.handshake(server(2))
    assert wire.sent() == [
        Command("subscribe", (("destination", "news"), ("filter", "n=N1"))),
        MessageFrame(1, "t", b"early"),
    ]
    assert result(d) == 1


def test_a_publish_made_before_ready_that_the_extensions_refuse_fails():
    wire = Wire()
    d = wire.proto.publish("t", b"x", type_name="T")  # dotnet is not going to be active
    wire.handshake(server(2))
    with pytest.raises(ValueError, match="dotnet"):
        result(d)


def test_an_error_frame_fails_what_is_pending_with_the_servers_text_and_closes():
    wire = ready_wire(window=1)
    wire.proto.publish("t", b"a")
    queued = wire.proto.publish("t", b"b")
    acked = wire.proto.when_acked()
    wire.feed(ErrorFrame("queue deleted"))
    for d in (queued, acked):
        with pytest.raises(MM2ServerError, match="queue deleted"):
            result(d)
    assert wire.closed
    with pytest.raises(MM2ServerError):
        result(wire.proto.publish("t", b"c"))


def test_garbage_from_the_server_gets_an_error_frame_and_a_close():
    wire = ready_wire()
    wire.proto.dataReceived(b"\xff")
    (error,) = wire.sent()
    assert isinstance(error, ErrorFrame) and "flags" in error.text
    assert wire.closed


def test_close_fails_what_is_pending_with_connection_closed():
    wire = ready_wire(window=1)
    wire.proto.publish("t", b"a")
    queued = wire.proto.publish("t", b"b")
    closed = wire.proto.close()
    with pytest.raises(MM2ConnectionClosed, match="closed by the client"):
        result(queued)
    wire.lose()
    assert result(closed) is None
