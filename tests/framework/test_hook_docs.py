"""Every hook is documented (docstring and docs/hooks.md) and tested; no phantom hooks.

A hook that a plugin author cannot read about, or that no test exercises, is a hook whose
behaviour can drift unnoticed; this test makes adding one without both fail the suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgbroker import hookspecs

ROOT = Path(__file__).parents[2]
HOOKS_MD = ROOT / "docs" / "hooks.md"
TESTS = ROOT / "tests"
HOOKS = hookspecs.hook_names()

# a hook's section heading is exactly "## `msgbroker_name`"
HEADING = re.compile(r"^## `(msgbroker_\w+)`\s*$", re.MULTILINE)
# any identifier that looks like a hook name, wherever it appears in the reference
HOOKLIKE = re.compile(r"\bmsgbroker_[a-z0-9_]+\b")


def _hooks_md() -> str:
    return HOOKS_MD.read_text(encoding="utf-8")


def _test_sources() -> dict[Path, str]:
    """Test modules only (``test_*.py``): a hook named only in a helper is not tested."""
    this = Path(__file__).resolve()
    return {
        path: path.read_text(encoding="utf-8")
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.resolve() != this
    }


def test_there_are_hooks():
    # guards the parametrized tests below against silently running on an empty list
    assert "msgbroker_authorize" in HOOKS


@pytest.mark.parametrize("name", HOOKS)
def test_hookspec_has_a_docstring(name):
    doc = getattr(hookspecs, name).__doc__
    assert (doc or "").strip(), f"{name} in framework/hookspecs.py has no docstring"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_a_section_in_docs(name):
    headings = HEADING.findall(_hooks_md())
    assert name in headings, f'docs/hooks.md has no section headed "## `{name}`"'


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_mentioned_by_some_test(name):
    users = [path for path, text in _test_sources().items() if name in text]
    assert users, f"no test module under tests/ mentions {name}: the hook has no test"


def test_docs_document_no_hook_that_does_not_exist():
    text = _hooks_md()
    headings = HEADING.findall(text)
    assert sorted(set(headings)) == sorted(headings), "a hook has two sections in docs/hooks.md"
    phantom = sorted(set(headings) - set(HOOKS))
    assert not phantom, f"docs/hooks.md documents hooks that do not exist: {phantom}"
    # stale names in prose or examples are as misleading as stale headings
    mentioned = sorted(set(HOOKLIKE.findall(text)) - set(HOOKS))
    assert not mentioned, f"docs/hooks.md mentions hooks that do not exist: {mentioned}"
