"""A temporary virtualenv with the example distributions installed, as a user would install
them next to msgbroker (msgbroker itself and its dependencies come from the test
environment, through a .pth file: the examples are what is new)."""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


def _site_packages(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)


@pytest.fixture(scope="session")
def example_venv(tmp_path_factory) -> Path:
    """A venv where ``pip install`` put examples/linepub and examples/custom-server; its
    python sees msgbroker (this checkout) and its dependencies through a .pth file."""
    venv = tmp_path_factory.mktemp("example-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # addsitedir (not a plain path line) so that msgbroker's own editable finder loads too
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    (_site_packages(venv) / "zz_test_environment.pth").write_text(lines)
    for name in ("linepub", "custom-server"):
        subprocess.run(
            [
                str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                "--no-build-isolation", "--no-index", str(EXAMPLES / name),
            ],
            check=True,
            cwd=venv,
        )
    return python
