"""A third-party Micromessage2 extension, installed as a distribution and found through the
``msgbroker`` entry point (the example of docs/mm2.md): a handshake property, a COMMAND,
an EXTENSION frame back, and a look at every incoming MESSAGE."""

from __future__ import annotations

import importlib
import sys

import pytest

from msgbroker import BrokerConfig
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import Command, ErrorFrame, ExtensionFrame, Handshake, MessageFrame
from msgbroker.testing import connect, make_broker

# the same plugin as docs/mm2.md's example
PLUGIN = """
from msgbroker import hookimpl
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.extensions import ExtensionHandler, ExtensionSpec


class Quota(ExtensionHandler):
    # x-quota:max=N: at most N messages on this connection; the command "quota" asks
    # how many are left, answered with an EXTENSION frame

    def __init__(self, context):
        super().__init__(context)
        self.left = int(context.extension.get("max", "100"))

    def incoming(self, message):
        if self.left == 0:
            raise RemoteProtocolError("quota exhausted")
        self.left -= 1
        return message

    def command(self, command):
        self.context.send_extension_frame(str(self.left).encode())


@hookimpl
def msgbroker_register_mm2_extensions(register):
    register(ExtensionSpec("x-quota", Quota, offer=True, commands=frozenset({"quota"})))
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    (tmp_path / "msgbroker_quota.py").write_text(PLUGIN)
    dist = tmp_path / "msgbroker_quota-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: msgbroker-quota\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[msgbroker]\nquota = msgbroker_quota\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("msgbroker_quota", None)


def test_an_installed_extension_is_offered_configured_and_called(installed):
    broker = make_broker(BrokerConfig(auth=("open",)))
    conn = connect(broker, "mm2")
    hello = Handshake("client", (), codec.parse_extension_list("pubsub;x-quota:max=2"))
    conn.send(codec.encode_handshake(hello))
    reply = codec.HandshakeDecoder().feed(conn.received())
    assert "x-quota" in [ext.name for ext in reply.optional]
    conn.send(codec.encode_handshake(hello))
    quota_id = codec.active_extensions(hello).id_of("x-quota")
    frames = codec.FrameDecoder()

    def send(*items):
        conn.send(b"".join(codec.encode_frame(item) for item in items))
        return list(frames.feed(conn.received()))

    assert send(Command("quota")) == [ExtensionFrame(quota_id, b"2")]
    assert send(MessageFrame(1, "t", b"one"), MessageFrame(2, "t", b"two")) == []
    assert send(Command("quota")) == [ExtensionFrame(quota_id, b"0")]
    assert send(MessageFrame(3, "t", b"three")) == [ErrorFrame("quota exhausted")]
    assert conn.closed


def test_without_the_plugin_the_extension_is_unsupported():
    broker = make_broker(BrokerConfig(auth=("open",)))
    conn = connect(broker, "mm2")
    conn.send(codec.encode_handshake(Handshake("client", codec.parse_extension_list("x-quota"))))
    assert list(codec.FrameDecoder().feed(conn.received())) == [
        ErrorFrame("unsupported extensions: x-quota")
    ]
