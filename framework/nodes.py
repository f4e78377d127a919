"""The broker's node name: what one broker is called among several run as one (a cluster).

``--node-name NAME`` (``node-name = "NAME"`` in the configuration file, or ``node-name`` in
its ``[cluster]`` table) names the node; without it the name is the host name and the first
listener's port (``db1:4444``), or for a first listener on a unix socket the host name and
the socket's file name (``db1:sbus.socket``). The name is in the journal's rows and file
names, the start-up log line, the admin API and metrics, and ``_sys/broker/node``; it is
read once, at start (a reload keeps it: the journal's files are named after it).

A name is 1 to :data:`MAX_LENGTH` characters of ``A-Z a-z 0-9 . _ : -``: it goes into file
names, metric labels and the cluster engine's keys as it is. A file name spells ``:`` as
``~`` (:func:`file_form`): Hadoop's paths, which Spark reads the journal through, take a
``:`` in a file name for a URI scheme and cannot read the file. ``~`` is no name character,
so the file form is as unique as the name.

The ``[cluster]`` table belongs to the cluster engine's plugin (its ``[cluster]`` section);
its ``node-name`` key is the broker's option, taken out of the table before the section
sees it (as ``[auth] schemes`` is ``--auth``; :data:`msgbroker.sections.OPTION_TABLES`).
Given both ways in one file, ``node-name`` at the top level and in ``[cluster]``, it is a
:class:`ConfigError` naming both; ``--node-name`` on the command line replaces either.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import BrokerConfig, Listener

__all__ = [
    "CLUSTER_TABLE",
    "MAX_LENGTH",
    "check_node_name",
    "default_node_name",
    "file_form",
    "node_name",
]

#: the configuration table whose ``node-name`` key is also the broker's ``--node-name``
CLUSTER_TABLE = "cluster"
MAX_LENGTH = 128
_NAME = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_LENGTH}}}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9._:-]+")
#: endpoint kinds whose first argument (or ``port=``) is a port
_PORT_KINDS = frozenset({"tcp", "tcp6", "tls", "ssl"})
_UNIX_KINDS = frozenset({"unix"})


def check_node_name(name: str) -> str:
    """``name`` if it is a valid node name, else :class:`ConfigError` saying why."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"bad node-name {name!r}: 1 to {MAX_LENGTH} characters of A-Z a-z 0-9 . _ : -"
        )
    return name


def node_name(config: BrokerConfig, listeners: Sequence[Listener], host: str | None = None) -> str:
    """The node name ``config`` gives (``--node-name``, ``[cluster] node-name``), else the
    default for ``listeners`` (the broker's, configured or embedded) on ``host`` (this
    machine's name by default): :func:`default_node_name`."""
    if config.node_name is not None:
        return check_node_name(config.node_name)
    return default_node_name(listeners, host)


def default_node_name(
    listeners: Sequence[Listener], host: str | None = None, bound: str | None = None
) -> str:
    """``HOST:PORT`` of the first listener (``HOST:FILE`` for a unix socket, its file's
    name), or ``HOST`` without listeners. ``bound``: what the first listener is bound to,
    as the log says it (``tcp:127.0.0.1:36173``, ``unix:/run/x.sock``), for a port 0 that
    the system chose. Characters a name cannot hold become ``-``."""
    host = _clean(host if host is not None else socket.gethostname()) or "localhost"
    if not listeners:
        return host[:MAX_LENGTH]
    where = _where(listeners[0].endpoint)
    if bound is not None and where in ("", "0"):
        where = _where(_as_endpoint(bound))
    where = _clean(where)
    name = f"{host}:{where}" if where else host
    return name[:MAX_LENGTH]


def file_form(name: str) -> str:
    """``name`` as it is spelled in file names: ``:`` as ``~`` (see the module docstring)."""
    return name.replace(":", "~")


def _clean(text: str) -> str:
    return _NOT_NAME.sub("-", text).strip("-")


def _as_endpoint(address: str) -> str:
    """A bound address as the log says it (``tcp:127.0.0.1:4444``, ``tcp:[::1]:4444``,
    ``tls:...``, ``unix:/path``) as an endpoint string whose first argument is the port or
    the path."""
    kind, _, rest = address.partition(":")
    if kind in _UNIX_KINDS or rest.startswith("unix:"):
        return "unix:" + rest.removeprefix("unix:")
    return f"{kind}:{rest.rpartition(':')[2]}"


def _where(endpoint: str) -> str:
    """The port of a TCP/TLS endpoint string, the file name of a unix one; for any other
    kind, the whole string (cleaned by the caller)."""
    parts = _split(endpoint)
    kind, args = parts[0].lower(), parts[1:]
    positional = [a for a in args if "=" not in a]
    named = dict(a.split("=", 1) for a in args if "=" in a)
    if kind in _PORT_KINDS:
        return named.get("port") or (positional[0] if positional else "")
    if kind in _UNIX_KINDS:
        path = named.get("address") or (positional[0] if positional else "")
        return PurePosixPath(path).name or path
    return endpoint


def _split(endpoint: str) -> list[str]:
    """A Twisted endpoint string's parts, split on ``:`` but not on ``\\:``."""
    parts, current, escaped = [], [], False
    for char in endpoint:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts
