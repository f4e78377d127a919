"""What a process loads at start, as a user runs it: a ``msgbroker`` client command imports
its own command's module and nothing of the analytics stack (pyarrow, numpy, PySpark,
pandas, matplotlib) nor of the server (Twisted, pyOpenSSL), and a broker or ``sbusd``
without ``--journal`` maps no pyarrow or numpy library. Checked by module and library
names, never by timing (docs/changes.md has the figures)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ssmp.e2e_support import LineReader, stop_process, twistd_broker

#: what a client command does without: the analytics stack, and Twisted and pyOpenSSL (the
#: command-line clients are the blocking ones, on the standard library's sockets and ssl)
HEAVY = ("pyarrow", "numpy", "pyspark", "pandas", "matplotlib", "py4j", "twisted", "OpenSSL")
#: runs ``msgbroker ARGS`` and, at exit, reports the heavy modules and the command modules
#: it imported (on stderr, after whatever the command wrote)
_RUN_AND_REPORT = f"""
import atexit, sys

def report():
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
    commands = sorted(m for m in sys.modules if m.endswith(".cli")
                      and m.startswith(("msgbroker.plugins.", "msgbroker.analytics.")))
    sys.stderr.write(f"\\nHEAVY={{','.join(heavy)}} COMMANDS={{','.join(commands)}}\\n")

atexit.register(report)
from msgbroker.cli import main
sys.exit(main(sys.argv[1:]))
"""


def msgbroker(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
    """Run ``msgbroker ARGS``: the process, the heavy modules it imported, its commands'."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"\nHEAVY=(\S*) COMMANDS=(\S*)\n$", done.stderr)
    assert found, done.stderr
    heavy, commands = (group.split(",") if group else [] for group in found.groups())
    return done, heavy, commands


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (("--help",), None),
        (("plugins",), None),
        (("ssmp", "--help"), "msgbroker.plugins.ssmp.cli"),
        (("stmp", "pub", "--help"), "msgbroker.plugins.stmp.cli"),
        (("mm2", "--help"), "msgbroker.plugins.mm2.cli"),
        (("sbus", "--help"), "msgbroker.plugins.sbus.cli"),
    ],
)
def test_a_command_imports_its_own_module_and_no_analytics(args, command):
    done, heavy, commands = msgbroker(*args)
    assert done.returncode == 0, done.stderr
    assert heavy == []
    assert commands == ([command] if command else [])


def test_analytics_help_does_not_import_the_analytics_stack_either():
    """Its jobs import PySpark and pyarrow when they run; ``--help`` does not run one."""
    done, heavy, commands = msgbroker("analytics", "--help")
    assert done.returncode == 0, done.stderr
    assert "report" in done.stdout
    assert heavy == []
    assert commands == ["msgbroker.analytics.cli"]


def test_ssmp_pub_and_sub_against_a_broker_import_no_analytics(tmp_path):
    with twistd_broker(tmp_path) as broker:
        where = ("--host", broker.host, "--port", str(broker.port))
        done, heavy, commands = msgbroker("ssmp", "pub", "news", "hello", "--id", "bob", *where)
        assert done.returncode == 0, done.stderr
        assert (heavy, commands) == ([], ["msgbroker.plugins.ssmp.cli"])


def _mapped(pid: int) -> set[str]:
    """The top-level packages of site-packages whose shared libraries ``pid`` has mapped."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return set(re.findall(r"site-packages/([A-Za-z0-9_]+?)(?:\.libs)?/", maps))


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "journal"])
def test_a_broker_maps_pyarrow_only_with_a_journal(tmp_path, journal):
    options = ["--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open"]
    if journal:
        options += ["--journal", str(tmp_path / "journal")]
    with twistd_broker(tmp_path, *options) as broker:
        if journal:
            broker.log.wait_for("journal writing to")
        mapped = _mapped(broker.process.pid)
    if journal:
        assert "pyarrow" in mapped  # the check sees it when it is there
    else:
        assert not mapped & {"pyarrow", "numpy"}, mapped


def test_sbusd_maps_no_pyarrow(tmp_path):
    sbusd = Path(sys.executable).with_name("sbusd")
    process = subprocess.Popen(
        [str(sbusd), "-f", "-a", str(tmp_path / "bus")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # -f closes stdout once the socket listens
        assert LineReader(process.stdout).rest() == ""
        mapped = _mapped(process.pid)
    finally:
        stop_process(process, 15)
    assert not mapped & {"pyarrow", "numpy"}, mapped
