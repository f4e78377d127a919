"""What a third-party plugin can do through public API, as the built-ins do: add hookspecs
(msgbroker_add_hookspecs) that other plugins implement whenever they register, call hooks
through ``broker.plugins``, keep per-broker state, add ``msgbroker`` commands
(msgbroker_register_commands), and show up in ``msgbroker plugins``. The greeter plugin
(tests/framework/plugin_dists.py) is a real distribution found through its entry points."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from msgbroker import Broker, BrokerConfig, ConfigError, Plugins, hookimpl, hookspec
from msgbroker.cli import CommandError, build_parser
from msgbroker.commands import LazyCommand
from msgbroker.pluginmanager import PluginManager, build_plugin_manager
from msgbroker.plugins.mm2.plugin import registry_for
from msgbroker.plugins.stmp.codec import parse_prefix
from msgbroker.plugins.stmp.plugin import router_for
from msgbroker.testing import make_broker
from tests.framework.plugin_dists import (
    child_env,
    forget,
    on_path,
    write_broken,
    write_greeter,
)

MSGBROKER = Path(sys.executable).with_name("msgbroker")
GREETER_MODULES = ("greeter", "greeter_hookspecs", "greeter_cli", "greeter_listener")


@pytest.fixture
def greeter(tmp_path, monkeypatch):
    root = write_greeter(tmp_path / "greeter")
    on_path(monkeypatch, root)
    forget(*GREETER_MODULES)
    yield root
    forget(*GREETER_MODULES)


def msgbroker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MSGBROKER), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


# -- hookspecs from plugins ---------------------------------------------------------------


class Specs:
    """A namespace of hookspecs, as a plugin adds them."""

    @hookspec
    def msgbroker_test_counted(self, count: int) -> None:
        """A count."""


class Declares:
    @hookimpl
    def msgbroker_add_hookspecs(self, add):
        add(Specs)


class Counts:
    def __init__(self):
        self.seen = []

    @hookimpl
    def msgbroker_test_counted(self, count):
        self.seen.append(count)


@pytest.mark.parametrize("implementation_first", [True, False])
def test_a_plugin_hook_is_implemented_whichever_registers_first(implementation_first):
    pm, counts, declares = PluginManager(), Counts(), Declares()
    for plugin in (counts, declares) if implementation_first else (declares, counts):
        pm.register(plugin)
    assert pm.unknown_hooks() == {}
    plugins = Plugins(pm)
    plugins.caller("msgbroker_test_counted")(count=3)
    assert counts.seen == [3]
    spec = plugins.hookspecs()["msgbroker_test_counted"]
    assert spec.owner == pm.get_name(declares)
    assert spec.function.__doc__ == "A count."


def test_an_implementation_that_does_not_fit_the_added_spec_is_refused():
    class Wrong:
        @hookimpl
        def msgbroker_test_counted(self, number):
            pass

    with pytest.raises(ConfigError, match="number"):
        build_plugin_manager(extra=[Wrong(), Declares()])


def test_a_hook_nobody_declares_is_refused_unless_optional():
    with pytest.raises(ConfigError, match="unknown hook 'msgbroker_test_counted'"):
        make_broker(plugins=[Counts()])

    class Optional:
        @hookimpl(optionalhook=True)
        def msgbroker_test_counted(self, count):
            pass

    assert make_broker(plugins=[Optional()]).plugins.implements("msgbroker_test_counted")


def test_two_plugins_adding_one_hook_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot add hookspecs"):
        make_broker(plugins=[Declares(), type("Again", (Declares,), {})()])


def test_the_built_in_extensions_load_where_mm2_is_blocked():
    broker = make_broker(BrokerConfig(auth=("open",), no_plugins=("mm2",)))
    assert "mm2" not in broker.protocols
    assert broker.plugins.get("mm2-extensions") is not None
    with pytest.raises(LookupError, match="msgbroker_register_mm2_extensions"):
        broker.plugins.caller("msgbroker_register_mm2_extensions")


def test_a_plugin_added_to_a_running_broker_may_add_and_implement_hooks():
    broker = make_broker()
    counts = Counts()
    with pytest.raises(ConfigError, match="unknown hook"):
        broker.add_plugin(counts, name="counts")
    assert broker.plugins.get("counts") is None
    broker.add_plugin(Declares(), name="declares")
    broker.add_plugin(counts, name="counts")
    broker.plugins.caller("msgbroker_test_counted")(count=1)
    assert counts.seen == [1]
    assert broker.remove_plugin(name="counts") is counts
    assert broker.plugins.get("counts") is None


def test_a_third_party_plugin_adds_a_hook_another_implements(greeter):
    """The listener registers before the greeter that declares the hook (entry points in
    name order), and implements it; the greeter also adds an STMP route (registered before
    the STMP plugin that declares that hook)."""
    broker = make_broker(BrokerConfig(auth=("open",), sections={"greeter": {"times": 2}}))
    names = broker.plugins.names()
    assert names.index("a-listener") < names.index("greeter") < names.index("stmp")
    broker.started()
    assert sys.modules["greeter_listener"].HEARD == ["hello hello"]
    route = router_for(broker).lookup(parse_prefix("10.9.1.2")[0])
    assert route is not None and route.handler is sys.modules["greeter"].greet


# -- the facade and per-broker state ------------------------------------------------------


def test_observation_hooks_are_bound_only_when_implemented():
    hooks = make_broker().plugins.bind()
    assert hooks.authorize is None and hooks.message_routed is None
    assert hooks.session_opened is None and hooks.run_routed is None

    class Authorizer:
        @hookimpl
        def msgbroker_authorize(self, session, action, topic):
            return topic != "no"

    broker = make_broker(plugins=[Authorizer()])
    authorize = broker.plugins.bind().authorize
    assert authorize is not None
    assert authorize(session=None, action="publish", topic="no") is False
    assert broker.authorizes


def test_plugin_state_belongs_to_its_broker():
    one, two = make_broker(), make_broker()
    assert router_for(one) is router_for(one)
    assert router_for(one) is not router_for(two)
    assert registry_for(one) is registry_for(one)
    assert registry_for(one) is not registry_for(two)
    made = []
    assert one.plugins.state("test.list", lambda: made.append(1) or made) is made
    assert one.plugins.state("test.list", list) is made
    assert two.plugins.state("test.list", list) == []


def test_plugins_are_found_by_name_and_listed_with_their_origin():
    broker = make_broker()
    assert broker.plugins.get("ssmp").__name__ == "msgbroker.plugins.ssmp.plugin"
    assert broker.plugins.get("no-such-plugin") is None
    info = {i.name: i for i in broker.plugins.info()}
    stmp = info["stmp"]
    assert (stmp.how, stmp.distribution, stmp.module) == (
        "entry point",
        "msgbroker",
        "msgbroker.plugins.stmp.plugin",
    )
    assert "msgbroker_register_protocols" in stmp.hooks
    assert stmp.hookspecs == ("msgbroker_register_stmp_routes",)


def test_no_code_outside_the_plugin_manager_calls_hooks_directly():
    """``pm.hook`` (and every other attribute of the pluggy manager) is read by the plugin
    manager and the facade only; everything else goes through ``Plugins``."""
    root = Path(__file__).parents[2]
    allowed = {root / "framework" / "pluginmanager.py", root / "framework" / "hooks.py"}
    found = []
    for path in sorted(
        p for d in ("framework", "plugins", "analytics") for p in (root / d).rglob("*.py")
    ):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (
                node.attr == "hook"
                or (isinstance(node.value, ast.Name | ast.Attribute) and _name(node.value) == "pm")
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def _name(node):
    """``pm`` for ``pm`` and ``x.pm``."""
    return node.id if isinstance(node, ast.Name) else node.attr


# -- commands -------------------------------------------------------------------------------


def test_help_lists_the_commands_in_their_order():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert list(subparsers.choices) == [
        "ssmp",
        "stmp",
        "mm2",
        "sbus",
        "users",
        "analytics",
        "plugins",
    ]


def test_the_command_line_imports_no_spark_and_the_broker_no_command(tmp_path):
    code = (
        "import sys\n"
        "from msgbroker.cli import build_parser\n"
        "build_parser()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'pandas', 'matplotlib', 'py4j', 'pyarrow', 'numpy'))\n"
        "commands = sorted(m for m in sys.modules if m.endswith('.cli') and "
        "m.startswith(('msgbroker.plugins.', 'msgbroker.analytics.')))\n"
        "assert not commands, commands\n"
        "assert not heavy, heavy\n"
        "for name in list(sys.modules):\n"
        "    if name.startswith('msgbroker'):\n"
        "        del sys.modules[name]\n"
        "from msgbroker.testing import make_broker\n"
        "make_broker()\n"
        "clis = sorted(m for m in sys.modules if m.endswith('.cli') and 'msgbroker' in m)\n"
        "assert not clis, clis\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


LAZY_TARGET = """
import sys

NAME = "lazy"
HELP = "a command imported when it runs"
IMPORTS = sys.modules.get(__name__)


def add_arguments(parser):
    parser.add_argument("word")


def run(args):
    print(f"lazy {args.word}")
    return 7
"""


def _lazy_plugins(*commands: LazyCommand) -> Plugins:
    class Commands:
        @hookimpl
        def msgbroker_register_commands(self, register):
            for command in commands:
                register(command)

    return Plugins.load(extra=(Commands(),))


def test_a_lazy_command_is_listed_without_its_module_and_imports_it_to_run(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "lazy_target.py").write_text(LAZY_TARGET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_target", raising=False)
    parser = build_parser(_lazy_plugins(LazyCommand("lazy", "run me later", "lazy_target")))
    assert "lazy_target" not in sys.modules
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert re.search(r"^ {4}lazy +run me later$", capsys.readouterr().out, re.MULTILINE)
    assert "lazy_target" not in sys.modules  # the list needs the name and help line only
    args = parser.parse_args(["lazy", "now"])
    assert "lazy_target" in sys.modules
    assert args.run(args) == 7
    assert capsys.readouterr().out == "lazy now\n"


def test_a_lazy_command_whose_module_is_broken_costs_a_line_when_it_is_run(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "broken_target.py").write_text("raise ImportError('half installed')\n")
    (tmp_path / "other_target.py").write_text(LAZY_TARGET)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = _lazy_plugins(
        LazyCommand("broken", "does not import", "broken_target"),
        LazyCommand("renamed", "is another command", "other_target"),
    )
    parser = build_parser(plugins)
    assert capsys.readouterr().err == ""  # nothing is imported to build the parser
    for name, problem in [
        ("broken", "ImportError('half installed')"),
        ("renamed", "TypeError(\"other_target is the command 'lazy', not 'renamed'\")"),
    ]:
        args = parser.parse_args([name])
        warning = rf"msgbroker: warning: plugin '\w+': the command {name!r} failed: "
        err = capsys.readouterr().err
        assert re.fullmatch(warning + re.escape(problem) + r" \(left out\)\n", err), err
        with pytest.raises(CommandError, match="is broken"):
            args.run(args)


def test_a_plugin_command_runs_end_to_end(tmp_path):
    env = child_env(write_greeter(tmp_path / "greeter"))
    done = msgbroker("greet", "alice", env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "hello alice\n", "")
    done = msgbroker("greet", "nobody", env=env)
    assert (done.returncode, done.stderr) == (1, "msgbroker: error: nobody to greet\n")
    done = msgbroker("--help", env=env)
    # a command's line is indented by four; its wrapped help further
    commands = re.findall(r"^ {4}(\S+)", done.stdout, re.MULTILINE)
    assert commands[:8] == ["ssmp", "stmp", "mm2", "sbus", "users", "analytics", "greet", "plugins"]


def test_a_broken_plugin_costs_one_line_not_every_command(tmp_path):
    env = child_env(write_broken(tmp_path / "broken"))
    done = msgbroker("ssmp", "--help", env=env)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: msgbroker ssmp")
    assert done.stderr.splitlines() == [
        "msgbroker: warning: plugin 'broken' (broken_plugin) failed to load: "
        "this plugin is broken (left out)"
    ]
    listed = msgbroker("plugins", env=env)
    assert listed.returncode == 0
    assert "broken (broken): plugin 'broken' (broken_plugin) failed to load" in listed.stdout


def test_a_command_that_is_none_or_taken_is_left_out_with_one_line(capsys):
    class Commands:
        @hookimpl
        def msgbroker_register_commands(self, register):
            register(types.SimpleNamespace(NAME="ssmp", HELP="", add_arguments=print, run=print))
            register(types.SimpleNamespace(NAME="half"))

    commands = Plugins.load(extra=(Commands(),)).commands(on_error=lambda plugin, line: print(line))
    assert [c.name for c in commands] == ["ssmp", "stmp", "mm2", "sbus", "users", "analytics"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "the command name 'ssmp' is taken (by plugin 'ssmp')" in lines[0]
    assert "is no command: it lacks HELP, add_arguments, run" in lines[1]


def test_msgbroker_plugins_lists_names_versions_hooks_and_what_they_add(tmp_path):
    done = msgbroker("plugins", env=child_env(write_greeter(tmp_path / "greeter")))
    assert (done.returncode, done.stderr) == (0, "")
    blocks: dict[str, list[str]] = {}
    name = ""
    for line in done.stdout.splitlines():
        if line.startswith("  "):
            blocks[name].append(line.strip())
        else:
            name = line.split()[0]
            blocks[name] = [line]
    assert blocks["ssmp"][0].startswith("ssmp (msgbroker 0.1.0): msgbroker.plugins.ssmp.plugin")
    assert "hooks: msgbroker_register_commands, msgbroker_register_protocols" in blocks["ssmp"]
    assert "commands: ssmp" in blocks["ssmp"]
    assert "hookspecs: msgbroker_register_stmp_routes" in blocks["stmp"]
    assert "sections: [journal]" in blocks["journal"]
    assert blocks["greeter"] == [
        "greeter (msgbroker-greeter 2.5): greeter",
        "hooks: msgbroker_add_hookspecs, msgbroker_broker_started, msgbroker_register_commands, "
        "msgbroker_register_config_sections, msgbroker_register_stmp_routes",
        "hookspecs: msgbroker_greeter_greeted",
        "commands: greet",
        "sections: [greeter]",
    ]
    assert blocks["a-listener"] == [
        "a-listener (msgbroker-greeter 2.5): greeter_listener",
        "hooks: msgbroker_greeter_greeted",
    ]


def test_broker_subclass_hooks_are_still_hooks():
    class Counting(Broker):
        def msgbroker_add_hookspecs(self, add):
            add(Specs)

    broker = make_broker(broker_class=Counting)
    assert "msgbroker_test_counted" in broker.plugins.hookspecs()
