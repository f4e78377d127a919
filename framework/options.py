"""Settings as the user gives them: :class:`Option` (a name, a kind, a help line) and the
conversion of a value of each kind, shared by the broker's options (:mod:`.config`) and the
plugins' sections (:mod:`.sections`)."""

from __future__ import annotations

from typing import Any

from attrs import frozen

from .errors import ConfigError

#: what an :class:`Option` holds: see ``Option.kind``
KINDS = ("list", "str", "float", "size", "count", "bool")


@frozen
class Option:
    """One setting: its name, its kind, and its help line. The broker's own are
    :data:`OPTIONS` (tap.py builds the ``twistd msgbroker`` options from them, so a setting
    is declared once); a plugin's are the ``options`` of its :class:`ConfigSection`."""

    #: the key: a top-level key and ``--NAME`` for the broker's options, the key in its
    #: ``[section]`` for a plugin's
    name: str
    #: ``list`` (repeatable), ``str``, ``float`` (seconds or a rate), ``size`` (bytes, K/M/G
    #: suffixes), ``count`` (a whole number), ``bool`` (a flag)
    kind: str
    help: str
    #: the attribute it sets (of BrokerConfig, or of the section's settings class): the
    #: name with underscores by default
    attribute: str = ""
    #: a plugin option's command-line option and top-level key: ``SECTION-NAME`` by default
    flag: str = ""

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name!r}: kind {self.kind!r} is none of {KINDS}")

    @property
    def field(self) -> str:
        return self.attribute or self.name.replace("-", "_")


def as_list(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{key} must be a string or a list of strings")


def convert(key: str, kind: str, value: Any) -> Any:
    """``value`` (from TOML, the command line or Python) as an option of ``kind``; ``key``
    names it in the error."""
    if kind == "list":
        return as_list(key, value)
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, not {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, not {value!r}")
        return value
    what = {"float": "a number", "count": "a whole number"}.get(kind, "a number of bytes")
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be {what}, not {value!r}")
    try:
        if kind == "float":
            return float(value)
        if kind == "count":
            return int(value)
        return parse_size(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be {what}, not {value!r}") from None


def parse_size(value: Any) -> int:
    """Bytes, as an int or a string with an optional K/M/G suffix (powers of 1024)."""
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    if scale != 1:
        text = text[:-1]
    return int(text) * scale
