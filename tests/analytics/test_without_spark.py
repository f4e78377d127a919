"""``msgbroker analytics ...`` without the spark extra: one error line saying what to install,
status 1, and no traceback (from any thread). Each command runs as its own process, as a
person runs it, with the extra's modules made missing by a ``sitecustomize`` that refuses
to import them (the machine running the tests has them installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from msgbroker.analytics.spark import SPARK_EXTRA

#: installed first thing in the process (``sitecustomize`` on ``PYTHONPATH``): every import
#: of the spark extra's modules fails as it does where they are not installed. And the
#: process waits for its threads at exit, so a thread's traceback cannot lose the race with
#: the exit and go unseen
HIDE_SPARK_EXTRA = f"""
import atexit
import sys
import threading

@atexit.register
def wait_for_threads():
    for thread in threading.enumerate():
        if thread is not threading.current_thread():
            thread.join(30)

class HideSparkExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {SPARK_EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, HideSparkExtra())
"""

ERROR = (
    "msgbroker: error: the spark extra is not installed (No module named 'pyspark'): "
    "pip install 'msgbroker[spark]'\n"
)


def hiding_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process where the spark extra's modules are missing."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(HIDE_SPARK_EXTRA)
    return {**os.environ, "PYTHONPATH": str(hide)}


def run_without_extra(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    msgbroker = Path(sys.executable).with_name("msgbroker")
    return subprocess.run(
        [str(msgbroker), "analytics", *args],
        capture_output=True,
        text=True,
        env=hiding_env(tmp_path),
        timeout=60,
        check=False,
    )


def test_the_extra_is_really_hidden(tmp_path):
    for name in SPARK_EXTRA:
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            capture_output=True,
            text=True,
            env=hiding_env(tmp_path),
            check=False,
        )
        assert done.returncode == 1
        assert f"ModuleNotFoundError: No module named '{name}'" in done.stderr


def test_report_is_one_error_line_and_no_traceback(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    done = run_without_extra(tmp_path, "report", str(journal), "--out", str(tmp_path / "out"))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", ERROR)
    assert not (tmp_path / "out").exists()


def test_prepare_is_one_error_line(tmp_path):
    done = run_without_extra(tmp_path, "prepare")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", ERROR)


def test_stream_is_one_error_line_before_it_contacts_the_broker(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    # no broker there: the missing extra is what it must say, not that it cannot connect
    done = run_without_extra(tmp_path, "stream", str(journal), "--broker", "127.0.0.1:9")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", ERROR)
