"""docs/architecture.md describes the code as it is: its layout block names every shipped
module (and no module that is gone), its list of built-in plugins is pyproject.toml's entry
points, and its table of close reasons is the CloseReason enum."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from msgbroker.reasons import CloseReason

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"\n{title}\n")
    following = re.search(r"\n#{1,3} ", DOC[start + len(title) + 2 :])
    end = start + len(title) + 2 + following.start() if following else len(DOC)
    return DOC[start:end]


def _layout() -> str:
    block = _section("## Layout")
    return block[block.index("```") + 3 : block.rindex("```")]


def _block(layout: str, top: str) -> str:
    """``top``'s line and the lines under it, up to the next top-level entry."""
    part = layout[layout.index(f"\n{top}") + 1 :]
    following = re.search(r"\n\S", part)
    return part[: following.start()] if following else part


def _entries(layout: str, top: str) -> dict[str, str]:
    """``top``'s entries (``name.py`` or ``name/``, two spaces in) -> their text, up to the
    next entry."""
    part = "\n" + _block(layout, top)
    entries: dict[str, str] = {}
    name = None
    for line in part.splitlines()[1:]:
        match = re.match(r"  (\S+)", line)
        if match:
            name = match.group(1)
            entries[name] = line
        elif name is not None:
            entries[name] += "\n" + line
    return entries


def _modules(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*.py")}


def test_the_layout_lists_every_framework_module_and_no_other():
    listed = {name for name in _entries(_layout(), "framework/") if name.endswith(".py")}
    assert listed == _modules(ROOT / "framework")


def test_the_layout_names_every_module_of_every_plugin_package():
    entries = _entries(_layout(), "plugins/")
    packages = sorted(p for p in (ROOT / "plugins").iterdir() if (p / "__init__.py").exists())
    assert {f"{p.name}/" for p in packages} <= set(entries)
    for package in packages:
        text = entries[f"{package.name}/"]
        missing = [
            m for m in _modules(package) - {"__init__.py"} if m.removesuffix(".py") not in text
        ]
        assert not missing, f"docs/architecture.md layout: plugins/{package.name}/ lacks {missing}"


def test_the_layout_names_every_analytics_module():
    text = _block(_layout(), "analytics/")
    missing = [m for m in _modules(ROOT / "analytics") - {"__init__.py"} if m[:-3] not in text]
    assert not missing


def test_the_built_ins_listed_are_the_entry_points():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = set(pyproject["project"]["entry-points"]["msgbroker"])
    paragraph = next(p for p in DOC.split("\n\n") if "**Built-ins**" in p)
    listed = set(re.findall(r"`([a-z0-9-]+)`", paragraph.split(":", 1)[1].split(".", 1)[0]))
    assert listed == declared


def test_the_close_reason_table_is_the_enum():
    table = _section("### Close reasons")
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([^|]+?) \|", table, re.MULTILINE)
    assert rows == [(member.name, member.value) for member in CloseReason]


PROTOCOL_SHAPE = {"codec", "protocol", "plugin", "client_session", "client", "blocking", "cli"}


def test_every_protocol_package_has_the_same_shape():
    protocols = [p for p in (ROOT / "plugins").iterdir() if (p / "protocol.py").exists()]
    example = ROOT / "examples" / "linepub" / "src" / "msgbroker_linepub"
    assert {p.name for p in protocols} == {"ssmp", "stmp", "mm2", "sbus"}
    for package in [*protocols, example]:
        stems = {m.removesuffix(".py") for m in _modules(package)}
        assert stems >= PROTOCOL_SHAPE, f"{package.name} lacks {PROTOCOL_SHAPE - stems}"
    assert "same shape" in DOC
