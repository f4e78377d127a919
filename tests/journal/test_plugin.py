"""The journal plugin in a real broker with raw SSMP clients: enabling it (and only then
observing routes), and what it records of messages, runs and sessions."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest
from twisted.internet.task import Clock

from msgbroker import Broker, BrokerConfig, ConfigError
from msgbroker.plugins.journal import plugin
from tests.ssmp.e2e_support import RawSSMP, raw_login, running_broker

LISTEN = ("ssmp=tcp:0:interface=127.0.0.1",)


Raw = RawSSMP
login = raw_login


def journal_at(directory, **settings) -> dict:
    """The ``sections`` of a config whose journal writes in ``directory``."""
    return {"journal": {"directory": str(directory), **settings}}


def read(directory, table: str) -> list[dict]:
    return ds.dataset(directory / table, partitioning="hive").to_table().to_pylist()


def test_without_journal_the_hub_has_no_observer():
    with running_broker(LISTEN, auth=("open",)) as broker:
        core = broker.service.broker
        assert core.hub.observer is None
        assert core.hub.run_observer is None
        assert core._opened is None and core._closed is None and core._login is None
        assert plugin.active_journal(core) is None


def test_with_journal_the_hub_observes_until_the_broker_stops(tmp_path):
    with running_broker(LISTEN, auth=("open",), sections=journal_at(tmp_path)) as broker:
        core = broker.service.broker
        assert core.hub.observer is not None
        assert core.hub.run_observer is not None
        journal = plugin.active_journal(core)
        assert journal is not None
        assert journal.writer._thread.is_alive()
    assert core.hub.observer is None and core.hub.run_observer is None
    assert plugin.active_journal(core) is None
    assert not journal.writer._thread.is_alive()


def test_journal_records_messages_runs_and_sessions(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret\n")
    journal_dir = tmp_path / "journal"
    with running_broker(
        LISTEN,
        auth=("open", "secret"),
        secret_file=str(secret),
        sections=journal_at(journal_dir, rotate_seconds=3600.0),
    ) as broker:
        runs = []
        journal = broker.call(plugin.active_journal, broker.service.broker)
        real_run = journal._run

        def counting_run(*args):
            runs.append(args[5])  # the count
            real_run(*args)

        journal._run = counting_run

        watcher = login(broker, "w")
        watcher.request(b"SUBSCRIBE t PRESENCE\n")
        sub = login(broker, "s")
        sub.request(b"SUBSCRIBE t\n")
        watcher.until(b"000 s SUBSCRIBE t\n")
        pub = login(broker, "p")
        pub.request(b"MCAST t hello\n")
        pipelined = [b"m%d" % i for i in range(50)]
        pub.send(b"".join(b"MCAST t %s\n" % p for p in pipelined))
        for _ in pipelined:
            assert pub.line() == b"200\n"
        pub.request(b"MCAST nobody x\n")

        intruder = Raw(broker)
        intruder.request(b"LOGIN eve secret guess\n", b"401 open secret\n")
        assert intruder.eof()
        intruder.close()

        pub.request(b"CLOSE\n")
        assert pub.eof()
        pub.close()
        sub.close()
        watcher.until(b"000 s UNSUBSCRIBE t\n")  # the broker saw it go
        # the watcher stays: the broker's shutdown closes it

    messages = read(journal_dir, "messages")
    mcasts = [r for r in messages if r["kind"] == "mcast"]
    first, *pipelined_rows, last = mcasts
    assert (first["count"], first["payload_size"], first["topic"]) == (1, 5, "t")
    assert (last["count"], last["payload_size"], last["topic"]) == (1, 1, "nobody")
    # however the pipelined MCASTs were chunked into runs, each run is one row
    assert sum(r["count"] for r in pipelined_rows) == 50 == sum(runs)
    assert sum(r["payload_size"] for r in pipelined_rows) == sum(map(len, pipelined))
    assert {r["topic"] for r in pipelined_rows} == {"t"}
    assert {(r["protocol"], r["sender"]) for r in mcasts} == {("ssmp", "p")}
    assert [dict(r["recipients"]) for r in mcasts] == [{"ssmp": 2}] * (len(mcasts) - 1) + [{}]
    assert [r["delivered"] for r in mcasts] == [2] * (len(mcasts) - 1) + [0]
    assert {(r["skipped"], r["dropped"], r["payload"]) for r in mcasts} == {(0, 0, None)}
    ts = [r["ts"] for r in messages]
    assert ts == sorted(ts)

    sessions = read(journal_dir, "sessions")
    ids = {}
    for row in sessions:
        if row["event"] == "open":
            assert row["session_id"] not in ids
            ids[row["session_id"]] = []
        ids[row["session_id"]].append(
            (row["event"], row["identity"], row["scheme"], row["reason"], row["host"])
        )
    host = "127.0.0.1"
    assert sorted(ids.values()) == sorted(
        [
            [
                ("open", None, None, None, host),
                ("login", "w", "open", None, host),
                ("close", "w", None, "shutdown", host),
            ],
            [
                ("open", None, None, None, host),
                ("login", "s", "open", None, host),
                ("close", "s", None, "closed by peer", host),
            ],
            [
                ("open", None, None, None, host),
                ("login", "p", "open", None, host),
                ("close", "p", None, "close requested", host),
            ],
            [
                ("open", None, None, None, host),
                ("auth_failure", "eve", "secret", "wrong secret", host),
                ("close", None, None, "login refused", host),
            ],
        ]
    )
    assert {r["protocol"] for r in sessions} == {"ssmp"}


def test_payloads_are_journaled_when_asked(tmp_path):
    with running_broker(
        LISTEN, auth=("open",), sections=journal_at(tmp_path, payloads=True)
    ) as broker:
        pub = login(broker, "p")
        pub.request(b"MCAST t hello\n")
        pub.send(b"MCAST t one\nMCAST t two\n")
        assert pub.line() + pub.line() == b"200\n200\n"
        pub.close()
    payloads = [r["payload"] for r in read(tmp_path, "messages") if r["kind"] == "mcast"]
    assert payloads == [b"hello", b"one", b"two"]


def test_an_unwritable_journal_directory_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    broker = Broker(BrokerConfig(sections=journal_at(blocker / "journal")), reactor=Clock())
    with pytest.raises(ConfigError, match=r"cannot write the journal in .*/file/journal"):
        broker.started()
    assert broker.hub.observer is None
