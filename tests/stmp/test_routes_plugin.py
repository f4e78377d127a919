"""A third-party plugin, installed as a distribution and found through the ``msgbroker``
entry point, routes STMP actions (the example of docs/stmp.md)."""

from __future__ import annotations

import importlib
import sys

import pytest

from msgbroker import BrokerConfig
from msgbroker.plugins.stmp import codec
from msgbroker.plugins.stmp.codec import Encoding, Request, Status
from msgbroker.plugins.stmp.payloads import decode_payload, encode_payload
from msgbroker.testing import connect, make_broker

# the same plugin as docs/stmp.md's example
PLUGIN = """
from msgbroker import hookimpl
from msgbroker.plugins.stmp.router import Reply, STMPStatusError

INVENTORY = {"apples": 3}


def stock(request):
    item = request.payload.get("item") if isinstance(request.payload, dict) else None
    if item not in INVENTORY:
        raise STMPStatusError(0x24, {"error": "no such item"})
    return {"item": item, "count": INVENTORY[item], "asked_by": request.session.identity}


async def restock(request):
    INVENTORY[request.payload["item"]] = request.payload["count"]
    return Reply(0x80, {"restocked": request.payload["item"]})  # a user-defined status


@hookimpl
def msgbroker_register_stmp_routes(router):
    router.add("10.1.0.1", stock)
    router.add("10.1.0.0/16", restock, timeout=5.0)
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    (tmp_path / "msgbroker_inventory.py").write_text(PLUGIN)
    dist = tmp_path / "msgbroker_inventory-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: msgbroker-inventory\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[msgbroker]\ninventory = msgbroker_inventory\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("msgbroker_inventory", None)


def call(conn, ident, action, obj):
    conn.send(
        codec.encode_binary(
            Request(ident, codec.parse_action(action), Encoding.JSON, encode_payload(obj, 2))
        )
    )
    (reply,) = codec.BinaryDecoder().feed(conn.received())
    return reply.status, decode_payload(reply.payload, reply.encoding)


def test_installed_plugin_routes_actions(installed):
    broker = make_broker(BrokerConfig(auth=("open",)))
    conn = connect(broker, "stmp")
    assert call(conn, 1, "0.0.1.1", {"id": "clerk", "scheme": "open"}) == (Status.OK, None)
    assert call(conn, 2, "10.1.0.1", {"item": "apples"}) == (
        Status.OK,
        {"item": "apples", "count": 3, "asked_by": "clerk"},
    )
    assert call(conn, 3, "10.1.0.1", {"item": "pears"}) == (0x24, {"error": "no such item"})
    assert call(conn, 4, "10.1.7.7", {"item": "pears", "count": 9}) == (
        0x80,
        {"restocked": "pears"},
    )
    assert call(conn, 5, "10.1.0.1", {"item": "pears"})[1]["count"] == 9


def test_blocking_the_plugin_removes_its_routes(installed):
    broker = make_broker(BrokerConfig(auth=("open",), no_plugins=("inventory",)))
    conn = connect(broker, "stmp")
    call(conn, 1, "0.0.1.1", {"id": "clerk", "scheme": "open"})
    assert call(conn, 2, "10.1.0.1", {"item": "apples"}) == (Status.NOT_FOUND, None)
