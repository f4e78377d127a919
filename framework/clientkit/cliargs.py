"""What a ``msgbroker PROTOCOL ...`` command's parser takes: the options of its
``connection`` group (:class:`Option`, :data:`HOST`, :func:`port`, :func:`identity`, the
login and TLS files) and the arguments of the actions most protocols share (``sub``:
:func:`add_sub`, :func:`add_topic_sub`; sending: :func:`add_send`).

Split out of :mod:`msgbroker.clientkit.cli` (the command skeleton, which runs the
command), which exports all of it: protocols import it from there.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from attrs import field, frozen


@frozen
class Option:
    """One option of the ``connection`` group: ``argparse``'s ``add_argument(*flags,
    **settings)``."""

    flags: tuple[str, ...]
    settings: dict[str, Any] = field(factory=dict)

    def add_to(self, group: Any) -> None:
        group.add_argument(*self.flags, **self.settings)


HOST = Option(("--host",), {"metavar": "HOST", "default": "127.0.0.1",
                            "help": "broker address [127.0.0.1]"})  # fmt: skip
SCHEME = Option(("--scheme",), {
    "metavar": "SCHEME",
    "help": "login scheme: open, secret, cert "
    "[secret with --secret-file, cert with --cert, else open]",
})  # fmt: skip
SECRET_FILE = Option(("--secret-file",), {
    "metavar": "PATH", "help": "file holding the shared secret (secret scheme)",
})  # fmt: skip
CA = Option(("--ca",), {"metavar": "PEM",
                        "help": "CA certificate to verify the broker with [system CAs]"})
KEY = Option(("--key",), {"metavar": "PEM", "help": "client private key [in --cert]"})


def port(default: int | None, text: str) -> Option:
    return Option(("--port",), {"metavar": "PORT", "type": int, "default": default, "help": text})


def identity(
    kind: Callable[[str], str] = str,
    text: str = "identity to log in as [cli-PID-RANDOM; with the cert scheme CN/cli-PID-RANDOM]",
) -> Option:
    """``--id``; ``kind`` checks it (an ``argparse`` type)."""
    return Option(("--id",), {"metavar": "ID", "type": kind, "help": text})


def cert(text: str = "client certificate, for the cert scheme (implies --tls)") -> Option:
    return Option(("--cert",), {"metavar": "PEM", "help": text})


def timeout(text: str = "how long to wait to connect and for replies [10]") -> Option:
    return Option(("--timeout",), {"metavar": "SECONDS", "type": float, "default": 10.0,
                                   "help": text})  # fmt: skip


def tls(text: str = "connect with TLS") -> Option:
    return Option(("--tls",), {"action": "store_true", "help": text})


#: the login options of a protocol with schemes, and the TLS files
LOGIN = (SCHEME, SECRET_FILE)
TLS_FILES = (CA, cert(), KEY)


def message_argument(value: str) -> bytes:
    """A message as typed: the bytes the user typed, even if not valid UTF-8."""
    return os.fsencode(value)


def add_sub(
    add: Callable[..., argparse.ArgumentParser],
    dest: str,
    metavar: str,
    kind: Callable[[str], Any] = str,
    *,
    description: str,
    help: str | None = None,  # noqa: A002 (argparse's name)
    presence: bool = False,
) -> argparse.ArgumentParser:
    """The ``sub`` action: one or more ``metavar`` (into ``args.<dest>``); with
    ``presence``, ``--presence``."""
    sub = add("sub", help=help or f"print messages sent to {metavar} until Ctrl-C",
              description=description)  # fmt: skip
    sub.add_argument(dest, nargs="+", type=kind, metavar=metavar)
    if presence:
        sub.add_argument("--presence", action="store_true",
                         help="also print 'ID joined|left TOPIC'")  # fmt: skip
    return sub


def add_topic_sub(
    add: Callable[..., argparse.ArgumentParser], kind: Callable[[str], Any], payload: str
) -> argparse.ArgumentParser:
    """The ``sub`` action of a topic protocol (``args.topics``, ``--presence``), whose
    lines are ``SENDER TOPIC PAYLOAD`` (see :meth:`ClientCommand.follow_topics`)."""
    return add_sub(
        add, "topics", "TOPIC", kind, presence=True,
        description=f"Print each message as 'SENDER TOPIC {payload}' (unicasts to this client "
        f"as 'SENDER @ID {payload}', broadcasts as 'SENDER * {payload}') until Ctrl-C.",
    )  # fmt: skip


def add_send(
    add: Callable[..., argparse.ArgumentParser],
    name: str,
    help: str,  # noqa: A002 (argparse's name)
    target: tuple[str, str, Callable[[str], Any]] | None = None,
    *,
    metavar: str = "MESSAGE",
    text: str = "the payload; - reads lines from stdin",
    **settings: Any,
) -> argparse.ArgumentParser:
    """An action sending a message (``pub``): ``target`` is where to, ``(dest, metavar,
    type)``, then the message (``args.message``, bytes; ``-``: lines of stdin)."""
    action = add(name, help=help, **settings)
    if target is not None:
        dest, target_metavar, kind = target
        action.add_argument(dest, type=kind, metavar=target_metavar)
    action.add_argument("message", type=message_argument, metavar=metavar, help=text)
    return action
