"""Third-party plugins as real distributions: a module, its ``*.dist-info`` with an
``entry_points.txt``, on a path of their own (``sys.path`` for this process, ``PYTHONPATH``
for a child), found through ``importlib.metadata`` exactly as an installed plugin is."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

#: the hook the greeter plugin adds (its own hookspec module)
GREETER_HOOKSPECS = '''
from msgbroker import hookspec


@hookspec
def msgbroker_greeter_greeted(greeting: str) -> None:
    """The greeter greeted: ``greeting`` is what it said."""
'''

#: adds a hook, a configuration section, an STMP route and a ``msgbroker greet`` command
GREETER = """
from attrs import frozen

from msgbroker import ConfigSection, Option, hookimpl

import greeter_hookspecs


@frozen
class GreeterSettings:
    greeting: str = "hello"
    times: int = 1
    loud: bool = False


SECTION = ConfigSection(
    "greeter",
    GreeterSettings,
    options=(
        Option("greeting", "str", "What to say."),
        Option("times", "count", "How many times."),
        Option("loud", "bool", "Shout it."),
    ),
)


def greet(request):
    return {"greeting": "hi " + request.session.identity}


@hookimpl
def msgbroker_add_hookspecs(add):
    add(greeter_hookspecs)


@hookimpl
def msgbroker_register_config_sections(register):
    register(SECTION)


@hookimpl
def msgbroker_register_stmp_routes(router):
    router.add("10.9.0.0/16", greet)


@hookimpl
def msgbroker_register_commands(register):
    import greeter_cli

    register(greeter_cli)


@hookimpl
def msgbroker_broker_started(broker):
    settings = broker.config.section("greeter", GreeterSettings)
    text = " ".join([settings.greeting] * settings.times)
    greeted = broker.plugins.caller("msgbroker_greeter_greeted")
    greeted(greeting=text.upper() if settings.loud else text)
"""

GREETER_CLI = """
from msgbroker.cli import CommandError

NAME = "greet"
HELP = "say hello to someone"


def add_arguments(parser):
    parser.add_argument("name")


def run(args):
    if args.name == "nobody":
        raise CommandError("nobody to greet")
    print(f"hello {args.name}")
    return 0
"""

#: implements the greeter's hook; its entry point sorts first, so it registers before the
#: plugin that declares the hook
LISTENER = """
from msgbroker import hookimpl

HEARD = []


@hookimpl
def msgbroker_greeter_greeted(greeting):
    HEARD.append(greeting)
"""

GREETER_ENTRY_POINTS = {"a-listener": "greeter_listener", "greeter": "greeter"}


def write_distribution(
    root: Path, name: str, version: str, modules: dict[str, str], entry_points: dict[str, str]
) -> Path:
    """``modules`` (import name -> source) and a distribution ``name`` declaring
    ``entry_points`` (entry-point name -> module) in the ``msgbroker`` group, under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    dist = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
    (dist / "entry_points.txt").write_text("[msgbroker]\n" + lines)
    return root


def write_greeter(root: Path) -> Path:
    modules = {
        "greeter": GREETER,
        "greeter_hookspecs": GREETER_HOOKSPECS,
        "greeter_cli": GREETER_CLI,
        "greeter_listener": LISTENER,
    }
    return write_distribution(root, "msgbroker-greeter", "2.5", modules, GREETER_ENTRY_POINTS)


def write_broken(root: Path) -> Path:
    """A plugin whose module raises on import."""
    modules = {"broken_plugin": "raise RuntimeError('this plugin is broken')\n"}
    return write_distribution(root, "msgbroker-broken", "0.1", modules, {"broken": "broken_plugin"})


def on_path(monkeypatch, root: Path) -> None:
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()


def forget(*modules: str) -> None:
    for module in modules:
        sys.modules.pop(module, None)


def child_env(*roots: Path) -> dict[str, str]:
    """The environment of a child process that has these distributions installed."""
    paths = [str(root) for root in roots]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
