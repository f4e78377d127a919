"""Built-in plugins use the framework exactly as a third-party plugin can: no private name
(``_x``) of a framework object or module. The framework objects a plugin is handed are the
broker, its hub and plugin manager, and sessions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parents[2] / "plugins"
#: names under which plugins hold framework objects (``self.hub``, ``broker``, ...)
FRAMEWORK_OBJECTS = {"hub", "broker", "pm", "session", "stats", "budget", "batcher"}


def _holder(node: ast.expr) -> str | None:
    """``hub`` for ``hub``, ``self.hub`` or ``x.session``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def private_uses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("msgbroker"):
            if not (node.module or "").startswith("msgbroker.plugins"):
                found += [
                    f"line {node.lineno}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and _holder(node.value) in FRAMEWORK_OBJECTS
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_the_check_finds_what_it_looks_for():
    assert private_uses("broker._bind_hooks()\nself.hub._x\nsession.data\nself._own\n") == [
        "line 1: broker._bind_hooks",
        "line 2: self.hub._x",
    ]
    assert private_uses("from msgbroker.hub import _secret, Hub\n") == [
        "line 1: from msgbroker.hub import _secret"
    ]


@pytest.mark.parametrize(
    "path", sorted(PLUGINS.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGINS))
)
def test_no_plugin_touches_a_private_name_of_the_framework(path):
    assert private_uses(path.read_text()) == []
