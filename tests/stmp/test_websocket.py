"""STMP over a real WebSocket, byte by byte: the version check with its list in a binary
payload frame, and what the server sends unasked (pings) in the framing the client logged in
with. The client here is raw frames on a socket, so nothing of msgbroker's client is used."""

from __future__ import annotations

import pytest

from msgbroker.plugins.stmp import codec, payloads
from msgbroker.plugins.stmp.codec import Encoding, Request, Response, Status
from tests.ssmp.e2e_support import running_broker
from tests.stmp.raw_support import BINARY, TEXT, RawWebSocket


@pytest.fixture(scope="module")
def broker():
    # a short keepalive: the ping tests wait for the broker's first ping
    with running_broker(
        ("stmp-ws=tcp:0:interface=127.0.0.1",), auth=("open",), keepalive=0.3
    ) as running:
        yield running


@pytest.fixture
def ws(broker):
    port = int(broker.service.broker.listening[0][1].rsplit(":", 1)[1])
    client = RawWebSocket(port)
    yield client
    client.close()


def test_a_version_list_in_a_binary_payload_frame_is_raw_bytes_and_so_is_the_answer(ws):
    ws.send(TEXT, b"1|5|0|0")  # request, raw, id 0, action 0: the payload follows
    ws.send(BINARY, b"\x02\x01")  # versions 0.2 and 0.1, as bytes
    assert ws.frame() == (TEXT, b"3|5|0|0")  # Ok, raw: the chosen version follows ...
    assert ws.frame() == (BINARY, b"\x01")  # ... as a byte, the way it was asked


def test_a_hex_version_list_in_a_binary_payload_frame_is_hex(ws):
    ws.send(TEXT, b"1|5|0|0")
    ws.send(BINARY, b"0201")  # lower-case hex digits: the text mode's form
    assert ws.frame() == (TEXT, b"3|5|0|0|01")


def test_a_version_list_inside_the_text_frame_is_hex_and_so_is_the_answer(ws):
    ws.send(TEXT, b"1|5|0|0|0201")
    assert ws.frame() == (TEXT, b"3|5|0|0|01")


def login_payload(identity: str) -> bytes:
    return payloads.encode_payload({"id": identity, "scheme": "open"}, Encoding.JSON)


def test_after_a_login_in_binary_frames_pings_are_binary_frames(ws):
    login = codec.encode_binary(Request(1, payloads.LOGIN, Encoding.JSON, login_payload("bf")))
    ws.send(BINARY, login[:7] + login[11:])  # a binary frame carries a message without PS
    assert ws.frame() == (BINARY, codec.encode_binary(Response(1, Status.OK)))
    assert ws.frame() == (BINARY, b"\x00")  # the broker's ping, within one keepalive


def test_after_a_login_in_text_frames_pings_are_text_frames(ws):
    ws.send(TEXT, b"1|2|1|257|" + login_payload("tf"))
    assert ws.frame() == (TEXT, b"3|0|1|0")
    assert ws.frame() == (TEXT, b"0")
