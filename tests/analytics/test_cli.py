"""``msgbroker analytics report`` through ``msgbroker.cli.main``: end to end once, and the
errors a person can make before Spark starts (no Java, a bad time window)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from msgbroker.analytics.charts import CHARTS
from msgbroker.analytics.java import JAVA_MISSING
from msgbroker.analytics.report import parse_time
from msgbroker.cli import main

STAGES = (
    "starting Spark",
    "using the running Spark",
    "reading the journal in ",
    "computing traffic, topics, talkers and sessions from",
    "computing the busiest topics minute by minute",
    "writing the tables in ",
    "writing ",
    "stopping Spark",
)


def stages(stderr: str) -> list[str]:
    """The stage lines (``msgbroker analytics: ... ...``) of ``stderr``, in order, each cut to
    the beginning a test can know (the journal's and the report's paths in full); checks
    that each is a known stage, coming after the ones before it."""
    found = []
    last = -1
    for line in stderr.splitlines():
        text = line.removeprefix("msgbroker analytics: ")
        if text == line or not text.endswith(" ..."):
            continue
        text = text.removesuffix(" ...")
        index = next(i for i, stage in enumerate(STAGES) if text.startswith(stage))
        assert index >= last, f"{text!r} out of order in {stderr!r}"
        last = index
        cut = STAGES[index] if index in (3, 4) else text
        found.append(cut.strip())
    return found


@pytest.mark.spark
def test_report_end_to_end(spark, sample_journal, tmp_path, capsys):
    # `spark` first: the command uses the running session (and leaves it running)
    out = tmp_path / "report"
    status = main(
        ["analytics", "report", str(sample_journal.root), "--out", str(out),
         "--since", "2026-11-21", "--master", "local[2]"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    assert captured.out == (
        f"report: {out / 'index.html'} (11 messages, 5 sessions; tables in {out / 'tables'})\n"
    )
    # one line per bad file, naming it
    lines = captured.err.splitlines()
    skips = [line for line in lines if line.startswith("msgbroker analytics: skipped ")]
    assert len(skips) == len(sample_journal.bad)
    for path in sample_journal.bad:
        assert sum(line.startswith(f"msgbroker analytics: skipped {path}: ") for line in skips) == 1
    # and the stages, in order, the first with Spark already running (this one)
    assert stages(captured.err) == [
        "using the running Spark",
        f"reading the journal in {sample_journal.root}",
        "computing traffic, topics, talkers and sessions from",
        "computing the busiest topics minute by minute",
        f"writing the tables in {out / 'tables'}",
        f"writing {out / 'index.html'}",
    ]
    assert (out / "index.html").is_file()
    [summary] = pq.read_table(out / "tables" / "summary").to_pylist()
    assert summary["since"] == dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    assert not spark.sparkContext._jsc.sc().isStopped()


@pytest.mark.spark
def test_report_as_its_own_process(sample_journal, tmp_path):
    """The command as a person runs it: a process that starts its own Spark (a bare
    SparkContext, the report needs no SQL session), reports, and stops it."""
    out = tmp_path / "report"
    msgbroker = Path(sys.executable).with_name("msgbroker")
    command = [str(msgbroker), "analytics", "report", str(sample_journal.root), "--out", str(out),
               "--master", "local[2]"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"report: {out / 'index.html'} (11 messages, 5 sessions; tables in {out / 'tables'})\n"
    )
    for path in sample_journal.bad:
        assert f"msgbroker analytics: skipped {path}: " in done.stderr
    assert "Traceback" not in done.stderr
    # a person sees what it is doing, from the start to the end
    found = stages(done.stderr)
    assert found[0] == "starting Spark (local[2])"
    assert found[1] == f"reading the journal in {sample_journal.root}"
    assert found[-2:] == [f"writing {out / 'index.html'}", "stopping Spark"]
    assert sorted(p.name for p in (out / "charts").iterdir()) == sorted(CHARTS)


def test_missing_java_is_one_line_saying_what_to_install(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("JAVA_HOME", str(empty))
    status = main(["analytics", "report", str(tmp_path), "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert status == 1
    assert captured.out == ""
    assert captured.err == f"msgbroker: error: {JAVA_MISSING}\n"
    assert "openjdk-17-jre-headless" in JAVA_MISSING
    assert not (tmp_path / "out").exists()


def test_since_must_be_before_until(tmp_path, capsys):
    status = main(
        ["analytics", "report", str(tmp_path), "--out", str(tmp_path / "out"),
         "--since", "2026-11-22T10:00", "--until", "2026-11-22T09:00"]
    )  # fmt: skip
    assert status == 1
    assert capsys.readouterr().err == "msgbroker: error: --since must be before --until\n"


def test_journal_dir_must_exist(tmp_path, capsys):
    status = main(["analytics", "report", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert status == 1
    assert capsys.readouterr().err == f"msgbroker: error: {tmp_path / 'nope'} is not a directory\n"


def test_a_time_that_is_not_iso_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analytics", "report", str(tmp_path), "--out", str(tmp_path), "--since", "yesterday"])
    assert exit_info.value.code == 2
    assert "'yesterday' is not an ISO 8601 date or time" in capsys.readouterr().err


def test_times_without_a_zone_are_utc():
    assert parse_time("2026-11-22T00:01") == dt.datetime(2026, 11, 22, 0, 1, tzinfo=dt.UTC)
    assert parse_time("2026-11-22") == dt.datetime(2026, 11, 22, tzinfo=dt.UTC)
    assert parse_time("2026-11-22T01:01+01:00") == dt.datetime(2026, 11, 22, 0, 1, tzinfo=dt.UTC)
