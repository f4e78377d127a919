"""``kill -9`` of a journaling ``twistd msgbroker`` leaves only complete, readable segments."""

from __future__ import annotations

import socket
import time

import pyarrow.parquet as pq

from msgbroker.plugins.journal import schema
from msgbroker.plugins.journal.writer import JournalWriter
from tests.ssmp.e2e_support import WAIT, twistd_broker

#: how long the publisher may take to see two segments written
DEADLINE = 30.0
BATCH = 200


def segments(directory) -> list:
    return list((directory / "messages").rglob("seg-*.parquet"))


def test_kill_9_leaves_only_complete_segments(tmp_path):
    journal = tmp_path / "journal"
    options = (
        "--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open",
        "--journal", str(journal), "--journal-rotate-seconds", "0.2", "--node-name", "n:1",
    )  # fmt: skip
    with twistd_broker(tmp_path, *options) as broker:
        sock = socket.create_connection((broker.host, broker.port), timeout=WAIT)
        replies = sock.makefile("rb")
        sock.sendall(b"LOGIN p open\n")
        assert replies.readline() == b"200\n"
        batch = b"".join(b"MCAST t message-%d\n" % i for i in range(BATCH))
        deadline = time.monotonic() + DEADLINE
        published = 0
        # publish until two segments are finalized (the publisher's round trips pace the
        # look at the directory; there is no event to wait on), then keep the writer busy
        while len(segments(journal)) < 2:
            assert time.monotonic() < deadline, "no two segments within the deadline"
            sock.sendall(batch)
            for _ in range(BATCH):
                assert replies.readline() == b"200\n"
            published += BATCH
        sock.sendall(batch)  # in flight while it dies
        broker.process.kill()
        assert broker.process.wait(WAIT) == -9
        sock.close()

    files = sorted(p for p in journal.rglob("*") if p.is_file())
    final = [p for p in files if not p.name.startswith(".")]
    assert len(final) >= 2
    rows = 0
    for path in final:
        table = pq.read_table(path)  # each reads completely: no half-written segment
        if path.is_relative_to(journal / "messages"):
            rows += table.num_rows
    assert 0 < rows <= published + BATCH
    # a hidden temporary may be left; the node's next writer removes it and goes on after
    # its last segment
    assert {schema.SEGMENT_RE.fullmatch(p.name).group(1) for p in final} == {"n~1"}
    restarted = JournalWriter(journal, node="n:1", start=False)
    assert restarted.removed == [p for p in files if p.name.startswith(".")]
    assert not list(journal.rglob(".*"))
    restarted.message(time.time_ns() // 1000, "ssmp", "p", "mcast", "t", b"x", {}, 0, 0)
    (new,) = restarted.flush()
    last = max(
        int(schema.SEGMENT_RE.fullmatch(p.name).group(2))
        for p in final
        if p.is_relative_to(journal / "messages")
    )
    assert new.name == f"seg-n~1-{last + 1:08d}.parquet"
