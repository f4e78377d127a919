"""Names that are not valid UTF-8 (lone surrogates: an sbus key ``k\\xff`` is the topic
``'k\\udcff'``) and records that cannot be built at all never cost the other records of a
batch: the writer stores such names escaped, and sets aside only what it cannot write."""

from __future__ import annotations

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.plugins.journal import names, schema
from msgbroker.plugins.journal.writer import JournalWriter
from msgbroker.plugins.sbus.blocking import BlockingSbusClient
from msgbroker.plugins.stmp import payloads as stmp_payloads
from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from msgbroker.plugins.stmp.codec import Encoding, Status
from tests.journal.test_writer import T0, journal
from tests.ssmp.e2e_support import running_broker

GOOD = 78


def read(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def good_messages(w: JournalWriter, count: int = GOOD) -> None:
    for i in range(count):
        w.message(T0 + i, "ssmp", f"s{i}", "mcast", f"t{i % 3}", b"x", {"ssmp": 1}, 0, 0)


def test_an_unwritable_topic_or_sender_is_stored_escaped_among_the_good_messages(tmp_path):
    warnings: list[str] = []
    w = journal(tmp_path, warn=warnings.append)
    good_messages(w, GOOD // 2)
    w.message(T0, "sbus", "!/cred/1/2/3", "mcast", "k\udcff", b"abc", {"sbus": 2}, 0, 0)
    w.message(T0, "stmp", "x\udcff", "ucast", "bob", b"", {}, 0, 0)
    w.run(T0, "ssmp", "p\\q\ud800", "mcast", "r\udcff", 5, lambda: [b"xy"] * 5, {}, 1)
    good_messages(w, GOOD // 2)
    (path,) = w.flush()
    rows = read(path)
    assert len(rows) == GOOD + 3
    assert (w.written, w.failed, warnings) == (GOOD + 3, 0, [])
    good = rows[: GOOD // 2] + rows[GOOD // 2 + 3 :]
    assert [r["sender"] for r in good] == [f"s{i}" for i in range(GOOD // 2)] * 2
    assert {r["escaped"] for r in good} == {None}
    sbus, stmp, run = rows[GOOD // 2 : GOOD // 2 + 3]
    assert (sbus["topic"], sbus["sender"], sbus["escaped"]) == ("k\\xff", "!/cred/1/2/3", ["topic"])
    assert (sbus["payload_size"], sbus["delivered"]) == (3, 2)
    assert (stmp["sender"], stmp["topic"], stmp["escaped"]) == ("x\\xff", "bob", ["sender"])
    assert (run["sender"], run["topic"]) == ("p\\\\q\\ud800", "r\\xff")
    assert run["escaped"] == ["sender", "topic"]
    assert (run["count"], run["payload_size"], run["dropped"]) == (5, 10, 1)
    # lossless: the escape gives back the names the broker routed
    assert names.unescape(run["sender"]) == "p\\q\ud800"
    assert names.unescape(sbus["topic"]) == "k\udcff"


def test_an_unwritable_identity_scheme_or_reason_is_stored_escaped(tmp_path):
    warnings: list[str] = []
    w = journal(tmp_path, warn=warnings.append)
    w.session(T0, schema.OPEN, "stmp", 1, None, "127.0.0.1", None, None)
    w.session(T0, schema.AUTH_FAILURE, "stmp", 1, "x\udcff", "127.0.0.1", "s\udc80", "no\ud800")
    w.session(T0, schema.CLOSE, "stmp", 1, None, "127.0.0.1", None, "login refused")
    (path,) = w.flush()
    assert (w.failed, warnings) == (0, [])
    opened, failure, closed = read(path)
    assert (opened["event"], opened["escaped"]) == ("open", None)
    assert (closed["reason"], closed["escaped"]) == ("login refused", None)
    assert (failure["identity"], failure["scheme"], failure["reason"]) == (
        "x\\xff",
        "s\\x80",
        "no\\ud800",
    )
    assert failure["escaped"] == ["identity", "scheme", "reason"]
    assert (failure["event"], failure["session_id"], failure["host"]) == (
        "auth_failure",
        1,
        "127.0.0.1",
    )


def test_with_payloads_a_run_to_an_unwritable_topic_keeps_its_rows(tmp_path):
    w = journal(tmp_path, keep_payloads=True)
    w.message(T0, "ssmp", "a", "mcast", "t", b"one", {"ssmp": 1}, 0, 0)
    w.run(T0, "sbus", "b", "mcast", "k\udcff", 2, lambda: [b"p1", b"p22"], {"ssmp": 1}, 0)
    (path,) = w.flush()
    rows = read(path)
    assert [(r["topic"], r["payload"], r["escaped"]) for r in rows] == [
        ("t", b"one", None),
        ("k\\xff", b"p1", ["topic"]),
        ("k\\xff", b"p22", ["topic"]),
    ]


def test_a_record_that_cannot_be_built_is_set_aside_alone_and_counted_in_one_line(tmp_path):
    """Whatever else makes a record unwritable (here: a delivery count no int32 holds, a
    session id that is not a number, a run whose payloads cannot be had), only it is lost."""
    warnings: list[str] = []
    w = journal(tmp_path, keep_payloads=True, warn=warnings.append)

    asked = []

    def gone_by_the_rotation() -> list[bytes]:
        asked.append(1)
        if len(asked) > 1:
            raise RuntimeError("payloads gone")
        return [b"a", b"b", b"c"]

    good_messages(w, 10)
    w.message(T0, "ssmp", "a", "mcast", "huge", b"", {"ssmp": 2**40}, 0, 0)
    w.message(T0, "sbus", "b", "mcast", "k\udcff", b"", {}, 0, 0)  # escaped, not set aside
    w.run(T0, "ssmp", "c", "mcast", "t", 3, gone_by_the_rotation, {}, 0)
    good_messages(w, 10)
    w.session(T0, schema.OPEN, "ssmp", 1, None, "", None, None)
    w.session(T0, schema.OPEN, "ssmp", "seven", None, "", None, None)  # type: ignore[arg-type]
    w.session(T0, schema.CLOSE, "ssmp", 1, "\udcff", "", None, "CLOSE")
    messages_path, sessions_path = w.flush()
    messages = read(messages_path)
    assert [r["topic"] for r in messages] == [f"t{i % 3}" for i in range(10)] + ["k\\xff"] + [
        f"t{i % 3}" for i in range(10)
    ]
    sessions = read(sessions_path)
    assert [(r["session_id"], r["identity"]) for r in sessions] == [(1, None), (1, "\\xff")]
    # the lost: one message and a run of three, one session event
    assert (w.failed, w.written) == (1 + 3 + 1, 21 + 2)
    assert len(warnings) == 2
    assert warnings[0].startswith("journal: 4 messages records cannot be written, left out of")
    assert warnings[1].startswith("journal: 1 sessions records cannot be written, left out of")


def test_a_batch_of_nothing_but_bad_records_writes_no_segment(tmp_path):
    warnings: list[str] = []
    w = journal(tmp_path, warn=warnings.append)
    w.message(T0, "ssmp", "a", "mcast", "t", b"", {"ssmp": 2**40}, 0, 0)
    assert w.flush() == []
    assert (w.failed, w.segments) == (1, 0)
    assert len(warnings) == 1


#: names of every kind: any text, lone surrogates, undecodable bytes as surrogateescape makes
#: them, and backslashes and the escape's own letters, which the escape must keep apart
NAMES = st.one_of(
    st.text(
        st.one_of(
            st.characters(),
            st.characters(codec=None, categories=["Cs"]),
            st.sampled_from("\\xu0f"),
        ),
        max_size=12,
    ),
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
OPTIONAL_NAMES = st.none() | NAMES


def stored(row: dict, column: str) -> str | None:
    value = row[column]
    return names.unescape(value) if column in (row["escaped"] or ()) else value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.tuples(NAMES, NAMES, st.booleans()), max_size=8),
    sessions=st.lists(st.tuples(OPTIONAL_NAMES, NAMES, OPTIONAL_NAMES, OPTIONAL_NAMES), max_size=8),
)
def test_no_name_ever_loses_a_record_and_every_name_reads_back(
    tmp_path_factory, messages, sessions
):
    tmp_path = tmp_path_factory.mktemp("journal")
    warnings: list[str] = []
    w = journal(tmp_path, warn=warnings.append)
    for sender, topic, run in messages:
        if run:  # a pipelined run: a record of its own kind
            w.run(T0, "ssmp", sender, "mcast", topic, 2, lambda: [b"a", b"b"], {}, 0)
        else:
            w.message(T0, "ssmp", sender, "mcast", topic, b"", {}, 0, 0)
    for identity, host, scheme, reason in sessions:
        w.session(T0, schema.LOGIN, "ssmp", 1, identity, host, scheme, reason)
    w.flush()
    assert (w.failed, w.written, warnings) == (0, len(messages) + len(sessions), [])
    if messages:
        rows = pq.read_table(tmp_path / schema.MESSAGES).to_pylist()
        assert [
            (stored(r, "sender"), stored(r, "topic"), r["count"] == 2) for r in rows
        ] == messages
    if sessions:
        rows = pq.read_table(tmp_path / schema.SESSIONS).to_pylist()
        assert [
            tuple(stored(r, c) for c in ("identity", "host", "scheme", "reason")) for r in rows
        ] == sessions


@given(NAMES)
def test_the_escape_is_valid_text_and_lossless(name):
    escaped = names.escape(name)
    escaped.encode("utf-8")  # storable
    assert names.unescape(escaped) == name
    assert names.needs_escape(name) == any(0xD800 <= ord(c) <= 0xDFFF for c in name)
    assert (escaped == name) == (not names.needs_escape(name) and "\\" not in name)


def test_a_failed_stmp_login_and_an_sbus_key_that_are_not_utf8_lose_nothing(tmp_path):
    """Through a real broker: an unauthenticated STMP client asks to log in as
    ``"x\\udcff"`` (JSON's escape for a lone surrogate) and fails, an sbus client publishes
    on the key ``k\\xff``; the journal keeps them, escaped, and every other event."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret\n")
    bus = tmp_path / "bus"
    journal_dir = tmp_path / "journal"
    with running_broker(
        ("stmp=tcp:0:interface=127.0.0.1", f"sbus=unix:{bus}"),
        auth=("open", "secret"),
        secret_file=str(secret),
        sections={"journal": {"directory": str(journal_dir), "rotate_seconds": 3600.0}},
    ) as broker:
        with BlockingSTMPClient("127.0.0.1", broker.port) as intruder:
            login = b'{"id":"x\\udcff","scheme":"secret","credential":"guess"}'
            refused = intruder.request(stmp_payloads.LOGIN, login, Encoding.JSON)
            assert refused.status == Status.UNAUTHORIZED
        with BlockingSbusClient(str(bus)) as sbus:
            sbus.publish(b"k\xff", b"odd key")
            sbus.publish(b"news", b"plain key")
            sbus.sync()  # both routed (and journaled) once the answer is back
        with BlockingSTMPClient("127.0.0.1", broker.port, "alice") as alice:
            alice.publish("news", b"hello")

    sessions = ds.dataset(journal_dir / "sessions", partitioning="hive").to_table().to_pylist()
    by_session: dict[int, list[tuple]] = {}
    for r in sessions:
        by_session.setdefault(r["session_id"], []).append(
            (r["protocol"], r["event"], r["identity"], r["escaped"])
        )
    # an sbus connection is known by its peer's credentials, whatever they are here
    (sbus_identity,) = {r["identity"] for r in sessions if r["protocol"] == "sbus"} - {None}
    assert sbus_identity.startswith("sbus:")
    assert sorted(by_session.values()) == [
        [("sbus", "open", None, None), ("sbus", "close", sbus_identity, None)],
        [
            ("stmp", "open", None, None),
            ("stmp", "auth_failure", "x\\xff", ["identity"]),
            ("stmp", "close", None, None),
        ],
        [
            ("stmp", "open", None, None),
            ("stmp", "login", "alice", None),
            ("stmp", "close", "alice", None),
        ],
    ]
    messages = ds.dataset(journal_dir / "messages", partitioning="hive").to_table().to_pylist()
    routed = [(r["protocol"], r["topic"], r["payload_size"], r["escaped"]) for r in messages]
    assert routed == [
        ("sbus", "k\\xff", len(b"odd key"), ["topic"]),
        ("sbus", "news", len(b"plain key"), None),
        ("stmp", "news", len(b"hello"), None),
    ]
