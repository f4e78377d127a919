"""A plugin's section of the configuration: :class:`ConfigSection`, declared through
``msgbroker_register_config_sections``.

Its keys go in the TOML file's ``[name]`` table; each option is also a command-line option
and a top-level key, its *flag* (``--journal-payloads``, ``journal-payloads = true``;
``NAME-KEY`` unless the option says otherwise). The values reach the plugin as the frozen
settings object its section makes (``config.section(name, SettingsClass)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from attrs import frozen

from .errors import ConfigError
from .options import Option, convert

_Settings_co = TypeVar("_Settings_co", covariant=True)

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")

#: tables some of whose keys are broker options: table -> {key in the table: the broker
#: option it is}; the table's other keys are the plugin section of the same name. So
#: ``auth = ["secret"]`` still works, and so does ``[auth]`` with ``schemes = ["password"]``
#: beside the users plugin's ``users = "FILE"`` (TOML cannot have both ``auth = [...]``
#: and an ``[auth]`` table); and ``[cluster]`` holds the cluster engine's keys beside the
#: broker's ``node-name`` (msgbroker.nodes). One option given both ways in one file is an
#: error
OPTION_TABLES: dict[str, dict[str, str]] = {
    "auth": {"schemes": "auth"},
    "cluster": {"node-name": "node-name"},
}


@frozen
class ConfigSection(Generic[_Settings_co]):
    """A plugin's section of the configuration: the ``[name]`` table of the TOML file, and
    its options, each also a command-line option (``--FLAG``) and a top-level key.

    ``settings`` makes the plugin's settings object from the values given, as keyword
    arguments named by each option's ``attribute``; options not given keep their defaults.
    A frozen attrs class with defaults is the usual choice; it may raise
    :class:`ConfigError` (or ``ValueError``) for values that do not go together."""

    #: ``[a-z0-9-]+``; by convention the plugin's name
    name: str
    settings: Callable[..., _Settings_co]
    options: tuple[Option, ...]
    #: one line on what the section is for (``msgbroker plugins`` shows it)
    help: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.name or not set(self.name) <= _NAME_CHARS:
            raise ValueError(f"configuration section names are [a-z0-9-]+: {self.name!r}")
        keys = [option.name for option in self.options]
        if len(set(keys)) != len(keys):
            raise ValueError(f"[{self.name}] declares a key twice")

    def flag(self, option: Option) -> str:
        """``option``'s command-line option (without ``--``), also its top-level key."""
        return option.flag or f"{self.name}-{option.name}"

    def flags(self) -> dict[str, Option]:
        return {self.flag(option): option for option in self.options}

    def resolve(self, given: Any) -> _Settings_co:
        """The settings object for the values ``given`` (key -> value; dashes or
        underscores), or ``given`` itself when it already is one."""
        if isinstance(self.settings, type) and isinstance(given, self.settings):
            return cast(_Settings_co, given)
        if not isinstance(given, Mapping):
            raise ConfigError(f"[{self.name}] must be a table, not {given!r}")
        by_key = {option.name: option for option in self.options}
        values: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for raw_key, value in given.items():
            key = str(raw_key).replace("_", "-")
            option = by_key.get(key)
            if option is None:
                known = ", ".join(by_key) or "none"
                raise ConfigError(
                    f"unknown key {raw_key!r} in the [{self.name}] section (known: {known})"
                )
            if key in spelled:
                raise ConfigError(f"[{self.name}] {key} is given twice ({spelled[key]!r} too)")
            spelled[key] = str(raw_key)
            values[option.field] = convert(self.flag(option), option.kind, value)
        try:
            return self.settings(**values)
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"[{self.name}]: {e}") from None


def check_sections(
    sections: Iterable[ConfigSection[Any]], broker_options: Iterable[str]
) -> tuple[ConfigSection[Any], ...]:
    """``sections`` as a tuple, refusing two with one name, a section named like one of
    ``broker_options``, and two options with one flag (or a flag that is a broker option)."""
    sections, broker_options = tuple(sections), frozenset(broker_options)
    names: set[str] = set()
    flags: dict[str, str] = dict.fromkeys(broker_options, "the broker")
    for section in sections:
        if section.name in names:
            raise ConfigError(f"two plugins declare the configuration section [{section.name}]")
        taken = OPTION_TABLES.get(section.name, {})
        if section.name in broker_options and section.name not in taken.values():
            raise ConfigError(f"the configuration section [{section.name}] is a broker option")
        for option in section.options:
            if option.name in taken:
                raise ConfigError(
                    f"[{section.name}] {option.name} is the broker's --{taken[option.name]}"
                )
        names.add(section.name)
        for flag in section.flags():
            if flag in flags:
                raise ConfigError(
                    f"the option --{flag} of [{section.name}] is already {flags[flag]}'s"
                )
            flags[flag] = f"[{section.name}]"
    return sections
