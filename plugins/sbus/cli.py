"""``msgbroker sbus ...``: sbus from the command line, on the blocking client.

::

    msgbroker sbus sub 'news/*'              # prints "KEY PAYLOAD" per message
    msgbroker sbus pub news/today 'hello'    # from another terminal
    tail -f log | msgbroker sbus pub logs/ - # one message per line
    msgbroker sbus whoami                    # prints "!/cred/GID/UID/PID"

The bus is ``-a/--address`` (a socket path, ``@name``, ``/dev/unix/abstract/HEX`` or
``/dev/fd/N``), else ``$SBUS_ADDRESS``, else where the broker's embedded default listens
(``$XDG_RUNTIME_DIR/msgbroker/sbus.socket``, or ``msgbroker-UID/sbus.socket`` in the
temporary directory without ``$XDG_RUNTIME_DIR``; ``--help`` shows which).

Printed lines (``sub``): ``KEY PAYLOAD``. Both are shown as ``msgbroker ssmp`` shows
payloads (UTF-8, backslash escapes for invalid bytes, unprintable characters and ``\\``),
and a space in the key as ``\\x20``, so the first space ends the key (an empty key: the
line starts with the space). Control messages are not printed (the broker sends none
unasked).

``sub`` announces itself on stderr once the broker has its subscriptions, and ``pub``
exits once the broker has handled what it sent: both wait for the answer to
``CMSG !/cred/whoami``, which the broker sends after everything written before it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgbroker.clientkit import cli as kit

from .addresses import default_path
from .blocking import ADDRESS_ENV, BlockingSbusClient, SbusConnectionClosed, default_address
from .codec import DEFAULT_MAX_PACKET, Publish
from .plugin import COMMAND as REGISTERED

NAME = REGISTERED.NAME
HELP = REGISTERED.HELP


def render_key(key: bytes) -> str:
    """``key`` for a terminal line: as :func:`~msgbroker.clientkit.cli.render_payload`, and
    no spaces."""
    return kit.render_payload(key).replace(" ", "\\x20")


def render_message(message: Publish) -> str:
    """One line for ``sub``: ``KEY PAYLOAD``."""
    return f"{render_key(message.key)} {kit.render_payload(message.payload)}"


class SbusCommand(kit.ClientCommand):
    options = (
        kit.Option(("-a", "--address"), {
            "metavar": "ADDRESS",
            "help": "the bus: a socket path, @NAME, /dev/unix/abstract/HEX or /dev/fd/N "
            f"[${ADDRESS_ENV}, else the broker's default, here {default_path()}]",
        }),
        kit.timeout("how long to wait to connect and for the broker [10]"),
    )  # fmt: skip

    def add_actions(self, add: Any) -> None:
        kit.add_sub(
            add, "patterns", "PATTERN", kit.message_argument,
            help="print messages whose key matches PATTERN until Ctrl-C",
            description="Print each message as 'KEY PAYLOAD' until Ctrl-C. In a PATTERN, * "
            "matches up to the next /, a trailing / matches everything below, and '' matches "
            "every key.",
        )  # fmt: skip
        kit.add_send(add, "pub", "publish MESSAGE with routing key KEY",
                     ("key", "KEY", kit.message_argument))  # fmt: skip
        add("whoami", help="print this process's credentials as the broker sees them "
            "(!/cred/GID/UID/PID)")  # fmt: skip

    def where(self, args: argparse.Namespace) -> str:
        return str(args.address or default_address())

    def open(self, args: argparse.Namespace) -> BlockingSbusClient:
        return BlockingSbusClient(self.where(args), timeout=args.timeout)

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        if isinstance(error, TimeoutError):
            return f"cannot connect to {self.where(args)}: no answer within {args.timeout:g} s"
        return None

    def act(self, client: BlockingSbusClient, args: argparse.Namespace) -> int:
        if args.action == "sub":
            return self.follow(
                args,
                lambda: self._subscribe(client, args),
                (render_message(p) if isinstance(p, Publish) else None  # control: not shown
                 for p in client.messages()),
                # an inherited socket (/dev/fd/N) cannot be opened again: its loss ends sub
                client if client.address.fd is None else None,
            )  # fmt: skip
        if args.action == "pub":
            for payload in kit.message_lines(args.message, sys.stdin.buffer):
                client.publish(args.key, payload)
            client.sync()  # the broker has it all (or closed the connection: an error)
        else:
            sys.stdout.write(client.whoami().decode("utf-8", "backslashreplace") + "\n")
        return 0

    @staticmethod
    def _subscribe(client: BlockingSbusClient, args: argparse.Namespace) -> tuple[str, str]:
        for pattern in args.patterns:
            client.subscribe(pattern)
        credentials = client.whoami()  # the subscriptions are in force now
        return " ".join(render_key(p) or "''" for p in args.patterns), render_key(credentials)

    def failed(self, error: Exception, args: argparse.Namespace) -> str | None:
        if isinstance(error, SbusConnectionClosed | TimeoutError):
            return f"{self.where(args)}: {kit.reason(error)}{_hint(args)}"
        return None


COMMAND = SbusCommand()
add_arguments, run = COMMAND.add_arguments, COMMAND.run


def _hint(args: argparse.Namespace) -> str:
    """Why the broker may have closed the connection: what sbus disconnects a client for."""
    if args.action == "sub" and any(p.startswith(b"!/cred/") for p in args.patterns):
        return " (a !/cred/ pattern must carry this process's credentials: see whoami)"
    if args.action == "pub" and len(args.key) + len(args.message) + 5 > DEFAULT_MAX_PACKET:
        return f" (a message over the broker's maximum packet, {DEFAULT_MAX_PACKET} bytes?)"
    return ""
