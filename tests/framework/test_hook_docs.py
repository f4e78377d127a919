"""Every hook is documented (docstring and docs/hooks.md) and tested; no phantom hooks.

A hook that a plugin author cannot read about, or that no test exercises, is a hook whose
behaviour can drift unnoticed; this test makes adding one without both fail the suite.
"Every hook" is every hook a broker with the built-in plugins knows: the framework's
(framework/hookspecs.py) and those the built-ins add (plugins/stmp/hookspecs.py, ...).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgbroker import hookspecs
from msgbroker.hooks import Plugins

ROOT = Path(__file__).parents[2]
HOOKS_MD = ROOT / "docs" / "hooks.md"
TESTS = ROOT / "tests"
SPECS = Plugins.load().hookspecs()
HOOKS = sorted(SPECS)

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
    assert set(hookspecs.hook_names()) <= set(HOOKS)


def test_plugin_hooks_are_their_plugins_own():
    assert SPECS["msgbroker_register_stmp_routes"].owner == "stmp"
    assert SPECS["msgbroker_register_mm2_extensions"].owner == "mm2"
    assert not hasattr(hookspecs, "msgbroker_register_stmp_routes")
    assert {SPECS[name].owner for name in hookspecs.hook_names()} == {None}


@pytest.mark.parametrize("name", HOOKS)
def test_hookspec_has_a_docstring(name):
    doc = SPECS[name].function.__doc__
    where = SPECS[name].function.__module__
    assert (doc or "").strip(), f"{name} in {where} has no docstring"


@pytest.mark.parametrize("name", HOOKS)
def test_hookspec_is_typed_without_any(name):
    """Every argument and the result are annotated with the real types (no ``Any``)."""
    function = SPECS[name].function
    annotations = function.__annotations__
    parameters = function.__code__.co_varnames[: function.__code__.co_argcount]
    assert set(parameters) | {"return"} == set(annotations), f"{name} lacks annotations"
    loose = {k: v for k, v in annotations.items() if re.search(r"\bAny\b", str(v))}
    assert not loose, f"{name} is typed Any: {loose}"


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
