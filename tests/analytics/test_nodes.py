"""The report over several nodes' journals (a cluster): a message counts once, where it was
published, however many nodes delivered it (``origin_node``, fed here through the journal
writer's public API as the cluster engine's deliveries will fill it in); deliveries, sessions
and refused logins count on their node; the per-node tables, and the page's Nodes section
only when there is more than one node. The report runs its tasks in this process
(tests/analytics/report_page.py); the last test runs the command on Spark over journals two
real brokers wrote."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from msgbroker import Kind, RemoteMessage
from msgbroker.analytics.nodes import journal_directories
from msgbroker.plugins.journal import schema
from msgbroker.plugins.journal.writer import JournalWriter
from tests.analytics.report_page import local_report, write_demo_journal

#: 2026-11-24 09:00:00 UTC, in microseconds
T0 = 1_795_510_800_000_000
MINUTE = 60_000_000
START = dt.datetime(2026, 11, 24, 9, 0, tzinfo=dt.UTC)


def node_journal(directory: Path, node: str) -> JournalWriter:
    return JournalWriter(directory, node=node, start=False)


def write_cluster(east_dir: Path, west_dir: Path) -> None:
    """Two nodes: alice publishes 3 messages on east (a run) and 1 on east to nobody; dave
    publishes 2 on west. Each node delivers the other's to its own subscribers, recorded
    with ``origin_node``; and west refused a login."""
    east, west = node_journal(east_dir, "east:4444"), node_journal(west_dir, "west:4444")
    # east: alice's run of 3 to news, to one local ssmp subscriber each
    east.run(T0, "ssmp", "alice", "mcast", "news", 3, lambda: [b"a" * 10] * 3, {"ssmp": 1}, 0)
    east.message(T0 + 1, "ssmp", "alice", "mcast", "quiet", b"x" * 5, {}, 0, 0)
    # west delivers alice's 3 to two subscribers of its own (one a slow one: 1 dropped)
    west.run(T0 + 2, "ssmp", "alice", "mcast", "news", 3, lambda: [b"a" * 10] * 3,
             {"stmp": 2}, 1, origin_node="east:4444")  # fmt: skip
    # dave's two on west, to one local mm2 subscriber; east delivers them to its ssmp one
    for i in range(2):
        ts = T0 + MINUTE + i
        west.message(ts, "mm2", "dave", "mcast", "news", b"d" * 7, {"mm2": 1}, 0, 0)
        east.message(ts + 5, "mm2", "dave", "mcast", "news", b"d" * 7, {"ssmp": 1}, 0, 0,
                     "west:4444")  # fmt: skip
    # sessions: one per publisher and subscriber, ids that happen to be equal on both nodes
    for writer, ids in ((east, (1, 2)), (west, (1, 2, 3))):
        for sid in ids:
            writer.session(T0 - MINUTE, schema.OPEN, "ssmp", sid, None, "10.0.0.1", None, None)
    west.session(T0, schema.AUTH_FAILURE, "ssmp", 3, "eve", "10.0.0.9", "secret", "wrong")
    west.session(T0, schema.CLOSE, "ssmp", 3, None, "10.0.0.9", None, "login refused")
    east.close()
    west.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    write_cluster(root / "journals" / "east", root / "journals" / "west")
    return root


def test_several_journals_are_one_report_each_message_counted_once(cluster, tmp_path):
    journals = [cluster / "journals" / "east", cluster / "journals" / "west"]
    report = local_report(journals, tmp_path / "report")  # type: ignore[arg-type]
    tables = {name: table.to_pylist() for name, table in report.tables.items()}
    (summary,) = tables["summary"]
    # published: alice's 3 + 1 on east, dave's 2 on west; west's 3 and east's 2 are
    # deliveries of those, not messages of their own
    assert (summary["messages"], summary["bytes"]) == (6, 30 + 5 + 14)
    # every node's deliveries: east 3 + 2, west 3 x 2 + 2
    assert (summary["delivered"], summary["dropped"]) == (13, 1)
    assert (summary["nodes"], summary["received"]) == (2, 5)
    assert (summary["sessions"], summary["auth_failures"]) == (5, 1)
    assert [(t["topic"], t["messages"], t["bytes"], t["delivered"]) for t in tables["topics"]] == [
        ("news", 5, 44, 13),
        ("quiet", 1, 5, 0),
    ]
    assert [(t["sender"], t["messages"]) for t in tables["top_talkers"]] == [
        ("alice", 4),
        ("dave", 2),
    ]
    # the fan-out is per node that routed a message: 3 + 2 on east, 3 + 2 on west
    assert [(f["delivered"], f["messages"]) for f in tables["fanout"]] == [(0, 1), (1, 7), (2, 3)]
    nodes = {n.pop("node"): n for n in tables["nodes"]}
    first, last = START, START + dt.timedelta(minutes=1, microseconds=6)
    assert nodes == {
        "east:4444": {
            "messages": 4, "received": 2, "bytes": 35, "delivered": 5, "skipped": 0,
            "dropped": 0, "sessions": 2, "open_sessions": 2, "auth_failures": 0,
            "first": first, "last": last,
        },
        "west:4444": {
            "messages": 2, "received": 3, "bytes": 14, "delivered": 8, "skipped": 0,
            "dropped": 1, "sessions": 3, "open_sessions": 2, "auth_failures": 1,
            "first": first + dt.timedelta(microseconds=2),
            "last": last - dt.timedelta(microseconds=5),
        },
    }  # fmt: skip
    minute = START + dt.timedelta(minutes=1)
    assert [tuple(r.values()) for r in tables["traffic_by_node_minute"]] == [
        (START, "east:4444", 4, 0, 35),
        (START, "west:4444", 0, 3, 0),
        (minute, "east:4444", 0, 2, 0),
        (minute, "west:4444", 2, 0, 14),
    ]
    # a session is its node and its id: both nodes have a session 1 and a session 2
    assert sorted((s["node"], s["session_id"]) for s in tables["sessions"]) == [
        ("east:4444", 1), ("east:4444", 2), ("west:4444", 1), ("west:4444", 2),
        ("west:4444", 3),
    ]  # fmt: skip
    # the busiest topics' series count each message once too
    series = [(r["minute"], r["topic"], r["messages"]) for r in tables["topics_by_minute"]]
    assert series == [(START, "news", 3), (START, "quiet", 1), (minute, "news", 2)]


def test_a_task_over_both_nodes_finds_what_tasks_over_each_find(cluster):
    """One task reading both nodes' segments (each step mixing nodes, received rows among
    them) and a task per node, merged, give the same partials: the shortcut for one node's
    rows is only a shortcut."""
    from msgbroker.analytics import grains, partials

    def run(items):
        found = {}
        for what, value in partials.task(items, None, None):
            assert what == "table"
            found.setdefault(value[0], []).append(partials.from_ipc(value[1]))
        return found

    def items(*nodes):
        return [
            (table, str(path))
            for node in nodes
            for table in ("messages", "sessions")
            for path in sorted((cluster / "journals" / node / table).rglob("seg-*.parquet"))
        ]

    together = run(items("east", "west"))
    apart = [run(items("east")), run(items("west"))]
    for grain in grains.MAIN_GRAINS:
        keys = [(k, "ascending") for k in grains.GRAINS[grain][0]]
        merged = partials.merge(grain, [t for found in apart for t in found[grain]])
        whole = partials.merge(grain, together[grain])
        assert whole.sort_by(keys).equals(merged.sort_by(keys)), grain
    by_sender = partials.merge("by_sender", together["by_sender"]).to_pylist()
    assert sum(r["received"] for r in by_sender) == 5
    assert {r["node"] for r in by_sender} == {"east:4444", "west:4444"}


def test_the_page_has_a_nodes_section_only_with_more_than_one_node(cluster, tmp_path):
    both = local_report(journal_directories([cluster / "journals"]), tmp_path / "both")
    page = both.index.read_text()
    titles = re.findall(r"<h2>(.*?)</h2>", page)
    assert titles[:2] == ["Nodes", "Traffic over time"]
    assert "charts/messages_per_node.png" in page
    assert (tmp_path / "both" / "charts" / "messages_per_node.png").is_file()
    assert "<th>node</th>" in page  # in the sessions table too
    assert "<div class=card><b>2</b><span>nodes</span></div>" in page
    assert f"{cluster / 'journals' / 'east'}, {cluster / 'journals' / 'west'}" in page
    one = local_report(cluster / "journals" / "east", tmp_path / "one")
    page = one.index.read_text()
    assert "Nodes" not in re.findall(r"<h2>(.*?)</h2>", page)
    assert "messages_per_node.png" not in page and "<th>node</th>" not in page
    # east's journal alone: what it received from west counts as deliveries, not messages
    (summary,) = one.tables["summary"].to_pylist()
    assert (summary["messages"], summary["delivered"], summary["received"]) == (4, 5, 2)
    assert "received from other nodes" in page
    assert [t["sender"] for t in one.tables["top_talkers"].to_pylist()] == ["alice"]


def test_a_directory_of_journals_stands_for_each_of_them(tmp_path):
    (tmp_path / "a" / "messages").mkdir(parents=True)
    (tmp_path / "b" / "sessions").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / ".hidden" / "messages").mkdir(parents=True)
    assert journal_directories(tmp_path) == [tmp_path / "a", tmp_path / "b"]
    # each once, in the order given; a journal is itself; an empty directory too
    assert journal_directories([tmp_path / "b", tmp_path, tmp_path / "notes"]) == [
        tmp_path / "b",
        tmp_path / "a",
        tmp_path / "notes",
    ]


def test_a_shared_directory_and_a_journal_from_before_node_names(tmp_path):
    """Both nodes write into one directory; an old journal (no node column) joins as the
    node ""."""
    shared = tmp_path / "shared"
    write_cluster(shared, shared)
    write_demo_journal(shared)  # segments without node columns, named as before
    report = local_report(shared, tmp_path / "report")
    assert [n["node"] for n in report.tables["nodes"].to_pylist()] == [
        "",
        "east:4444",
        "west:4444",
    ]
    assert "<td>(unnamed)</td>" in report.index.read_text()
    names = sorted(p.name for p in (shared / "messages").rglob("seg-*"))
    assert "seg-east~4444-00000000.parquet" in names and "seg-00000001.parquet" in names


@pytest.mark.spark
def test_two_real_brokers_journals_make_one_report(spark, tmp_path, capsys):
    """Two brokers named east and west, each journaling into its own directory; what the
    cluster engine will do is done by hand: each routes the other's messages to its own
    subscribers as RemoteMessages. Then `msgbroker analytics report east west` on Spark."""
    from msgbroker.cli import main
    from tests.ssmp.e2e_support import RawSSMP, running_broker

    def broker(node: str):
        journal = {"directory": str(tmp_path / node), "rotate_seconds": 3600}
        return running_broker(auth=("open",), node_name=node, sections={"journal": journal})

    def deliver_from(origin: str, node, payloads: list[bytes]) -> None:
        hub, batcher = node.service.broker.hub, node.service.broker.batcher

        def route() -> None:
            for payload in payloads:
                message = RemoteMessage(
                    Kind.MCAST, "alice", "ssmp", "news", payload, origin_node=origin
                )
                hub.multicast(None, message)
            batcher.flush()

        node.call(route)

    with broker("east") as east, broker("west") as west:
        bob, carol = RawSSMP(east), RawSSMP(west)
        bob.request(b"LOGIN bob open\nSUBSCRIBE news\n", b"200\n200\n")
        carol.request(b"LOGIN carol open\nSUBSCRIBE news\n", b"200\n200\n")
        alice = RawSSMP(east)
        alice.request(b"LOGIN alice open\nMCAST news one\nMCAST news two\n", b"200\n" * 3)
        for client in (bob, carol):
            if client is carol:
                deliver_from("east", west, [b"one", b"two"])
            assert client.line() == b"000 alice MCAST news one\n"
            assert client.line() == b"000 alice MCAST news two\n"
        for client in (alice, bob, carol):
            client.close()
    out = tmp_path / "report"
    status = main(["analytics", "report", str(tmp_path / "east"), str(tmp_path / "west"),
                   "--out", str(out), "--master", "local[2]"])  # fmt: skip
    assert status == 0
    assert capsys.readouterr().out == (
        f"report: {out / 'index.html'} (2 messages, 3 sessions, 2 nodes; "
        f"tables in {out / 'tables'})\n"
    )
    nodes = pq.read_table(out / "tables" / "nodes").to_pylist()
    assert [(n["node"], n["messages"], n["received"], n["delivered"], n["sessions"])
            for n in nodes] == [("east", 2, 0, 2, 2), ("west", 0, 2, 2, 1)]  # fmt: skip
    (topic,) = pq.read_table(out / "tables" / "topics").to_pylist()
    assert (topic["topic"], topic["messages"], topic["delivered"]) == ("news", 2, 4)
    assert "<h2>Nodes</h2>" in (out / "index.html").read_text()
