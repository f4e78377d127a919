"""scripts/setup as the two README commands use it: pip runs once, then not again while
nothing it depends on changed (scripts/run starts at once), each stage is one line, and a
set-up that is current prints nothing. Run on a copy of the project whose ``.venv/bin/python``
is a stand-in recording the pip calls (a real install takes minutes and a network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]

#: .venv/bin/python: records ``-m pip ...`` calls, runs anything else with the real Python
FAKE_PYTHON = f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then
    echo "$*" >>"$(dirname "$0")/../pip-calls"
    exit 0
fi
exec {sys.executable} "$@"
"""


def project(tmp_path: Path) -> Path:
    """A copy of what scripts/setup reads, with a virtualenv whose pip is the stand-in."""
    root = tmp_path / "msgbroker"
    for name in ("scripts", "framework", "plugins", "analytics", "twisted"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return root


def setup(root: Path, *extras: str) -> tuple[str, list[str]]:
    """Run scripts/setup: what it printed (stderr; stdout must be empty) and the pip calls."""
    calls = root / ".venv" / "pip-calls"
    calls.unlink(missing_ok=True)
    done = subprocess.run(
        [str(root / "scripts" / "setup"), *extras],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    return done.stderr, calls.read_text().splitlines() if calls.exists() else []


def test_setup_runs_pip_once_then_not_while_nothing_changed(tmp_path):
    root = project(tmp_path)
    printed, calls = setup(root)
    assert printed == (
        "scripts/setup: installing msgbroker into .venv (pip; a minute or two the first time)\n"
    )
    assert len(calls) == 1
    assert calls[0].startswith("-m pip install -qq ")  # quiet: errors only
    assert calls[0].endswith("-e . --config-settings editable_mode=strict")
    # current: nothing printed, no pip (scripts/run starts the broker at once)
    assert setup(root) == ("", [])
    # an edited file needs no new install (strict editable mode links the files) ...
    with (root / "framework" / "cli.py").open("a") as f:
        f.write("# edited\n")
    assert setup(root) == ("", [])
    # ... a new module does, and so does a changed pyproject.toml
    (root / "plugins" / "ssmp" / "extra.py").write_text("")
    assert len(setup(root)[1]) == 1
    assert setup(root) == ("", [])
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# a dependency changed\n")
    assert len(setup(root)[1]) == 1


def test_an_extra_not_installed_yet_installs_and_keeps_the_ones_there(tmp_path):
    root = project(tmp_path)
    setup(root, "bench")
    assert setup(root, "bench") == ("", [])
    assert setup(root) == ("", [])  # what scripts/run asks for is there already
    printed, calls = setup(root, "extra,more")
    assert "installing msgbroker with [bench,extra,more] into .venv" in printed
    assert calls[0].endswith("-e .[bench,extra,more] --config-settings editable_mode=strict")
    assert setup(root, "bench") == ("", [])


def test_a_failed_install_is_tried_again(tmp_path):
    root = project(tmp_path)
    python = root / ".venv" / "bin" / "python"
    python.write_text(FAKE_PYTHON.replace("exit 0", "exit 1"))
    done = subprocess.run([str(root / "scripts" / "setup")], capture_output=True, check=False)
    assert done.returncode == 1
    python.write_text(FAKE_PYTHON)
    assert len(setup(root)[1]) == 1
