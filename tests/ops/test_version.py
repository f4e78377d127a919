"""``msgbroker --version`` and ``twistd msgbroker --version`` say the installed version."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from msgbroker.cli import main, version_line

BIN = Path(sys.executable).parent


def test_msgbroker_version():
    out = subprocess.run(
        [BIN / "msgbroker", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(f"msgbroker {metadata.version('msgbroker')} (Twisted ")
    assert out.count("\n") == 1


def test_twistd_msgbroker_version():
    out = subprocess.run(
        [BIN / "twistd", "msgbroker", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith(f"msgbroker {metadata.version('msgbroker')} (Twisted ")


def test_the_version_is_in_the_help():
    out = subprocess.run(
        [BIN / "msgbroker", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--version" in out


def test_the_version_option_before_a_command_is_the_same():
    # through argparse (any other argument after it) rather than the fast path
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--version", "plugins"])
    assert out.getvalue() == version_line() + "\n"
