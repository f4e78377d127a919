"""The journal as several nodes write it: every row names its node, a message another node
published names its origin, and nodes share one directory without touching each other's
files (their own sequence numbers, their own temporaries). And a real broker's journal
carries its node name."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from msgbroker import Kind, Message, RemoteMessage, RouteResult
from msgbroker.message import MessageRun
from msgbroker.plugins.journal import schema
from msgbroker.plugins.journal.recorder import Journal
from msgbroker.plugins.journal.writer import JournalWriter
from tests.ssmp.e2e_support import RawSSMP, running_broker

T0 = 1_700_000_000_000_000
DAY = "date=2023-11-14"


def writer(path, node: str = "", **options) -> JournalWriter:
    return JournalWriter(path, node=node, start=False, **options)


def names(path) -> list[str]:
    return sorted(p.name for p in path.rglob("*") if p.is_file())


def test_nodes_share_a_directory_each_numbering_its_own_segments(tmp_path):
    east, west = writer(tmp_path, "east:4444"), writer(tmp_path, "west:4444")
    for w in (east, west, east):
        w.message(T0, "ssmp", "a", "mcast", "t", b"x", {}, 0, 0)
        w.session(T0, schema.OPEN, "ssmp", 1, None, "", None, None)
        w.flush()
    day = tmp_path / "messages" / DAY
    assert names(day) == [
        "seg-east~4444-00000000.parquet",
        "seg-east~4444-00000001.parquet",
        "seg-west~4444-00000000.parquet",
    ]
    table = pq.read_table(tmp_path / "messages")
    assert sorted(table.column("node").to_pylist()) == ["east:4444", "east:4444", "west:4444"]
    sessions = pq.read_table(tmp_path / "sessions")
    assert sorted(sessions.column("node").to_pylist()) == ["east:4444", "east:4444", "west:4444"]
    # a restarted node goes on after its own last segment, whatever the others wrote
    west.flush()
    again = writer(tmp_path, "west:4444")
    again.message(T0, "ssmp", "a", "mcast", "t", b"x", {}, 0, 0)
    assert [p.name for p in again.flush()] == ["seg-west~4444-00000001.parquet"]


def test_a_node_removes_only_its_own_temporaries(tmp_path):
    writer(tmp_path, "east").flush()
    day = tmp_path / "messages" / DAY
    day.mkdir(parents=True)
    mine = day / ".seg-east-00000003.parquet.tmp"
    older = day / ".seg-00000007.parquet.tmp"  # a writer before node names: it was alone
    theirs = day / ".seg-west-00000002.parquet.tmp"  # being written by west right now
    for path in (mine, older, theirs):
        path.write_bytes(b"PAR1 interrupted")
    restarted = writer(tmp_path, "east")
    assert sorted(restarted.removed) == sorted([mine, older])
    assert theirs.exists()
    # the segments of a writer without a node are named as before node names
    legacy = writer(tmp_path)
    legacy.message(T0, "ssmp", "a", "mcast", "t", b"x", {}, 0, 0)
    assert [p.name for p in legacy.flush()] == ["seg-00000000.parquet"]
    assert theirs.exists()


@pytest.mark.parametrize("keep_payloads", [False, True])
def test_a_delivery_of_another_nodes_message_records_its_origin(tmp_path, keep_payloads):
    """What the cluster engine does: route a message (or a run) another node published to
    this node's subscribers, as a RemoteMessage (a run with ``origin_node``); the journal's
    rows say where it was published."""
    w = writer(tmp_path, "west:4444", keep_payloads=keep_payloads)
    journal = Journal(w)
    journal.msgbroker_message_routed(
        Message(Kind.MCAST, "alice", "ssmp", "t", b"local"), RouteResult({"ssmp": 1})
    )
    journal.msgbroker_message_routed(
        RemoteMessage(Kind.MCAST, "bob", "ssmp", "t", b"remote", origin_node="east:4444"),
        RouteResult({"ssmp": 2}),
    )
    run = MessageRun(
        Kind.MCAST, "carol", "stmp", "t", 3, lambda: [b"a", b"b", b"c"], origin_node="east:4444"
    )
    journal.msgbroker_run_routed(run, RouteResult({"mm2": 1}))
    w.flush()
    found = pq.read_table(tmp_path / "messages").to_pylist()
    rows = [(r["sender"], r["count"], r["delivered"], r["origin_node"]) for r in found]
    runs = [("carol", 1, 1, "east:4444")] * 3 if keep_payloads else [("carol", 3, 1, "east:4444")]
    assert rows == [("alice", 1, 1, None), ("bob", 1, 2, "east:4444"), *runs]
    assert {r["node"] for r in found} == {"west:4444"}
    # the run's messages, when someone needs them one by one, are remote ones too
    assert {m.origin_node for m in run.messages()} == {"east:4444"}
    assert Message(Kind.MCAST, "a", "ssmp", "t").origin_node is None


def test_an_origin_that_is_not_text_is_stored_escaped(tmp_path):
    w = writer(tmp_path, "west")
    w.message(T0, "ssmp", "a", "mcast", "t", b"x", {}, 0, 0, "bad\udcff")
    w.flush()
    (row,) = pq.read_table(tmp_path / "messages").to_pylist()
    assert (row["origin_node"], row["escaped"]) == ("bad\\xff", ["origin_node"])


def test_a_brokers_journal_carries_its_node_name(tmp_path):
    journal = tmp_path / "journal"
    listen = ("ssmp=tcp:0:interface=127.0.0.1",)
    with running_broker(
        listen,
        auth=("open",),
        node_name="east-1",
        sections={"journal": {"directory": str(journal), "rotate_seconds": 3600}},
    ) as broker:
        client = RawSSMP(broker)
        client.request(b"LOGIN alice open\nMCAST t hello\n", b"200\n200\n")
        client.close()
    files = names(journal)
    assert files and all(name.startswith("seg-east-1-") for name in files)
    assert pq.read_table(journal / "messages").column("node").to_pylist() == ["east-1"]
    assert set(pq.read_table(journal / "sessions").column("node").to_pylist()) == {"east-1"}
