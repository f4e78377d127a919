"""``msgbroker sbus ...``: sbus from the command line, on the blocking client.

::

    msgbroker sbus sub 'news/*'              # prints "KEY PAYLOAD" per message
    msgbroker sbus pub news/today 'hello'    # from another terminal
    tail -f log | msgbroker sbus pub logs/ - # one message per line
    msgbroker sbus whoami                    # prints "!/cred/GID/UID/PID"

The bus is ``-a/--address`` (a socket path, ``@name``, ``/dev/unix/abstract/HEX`` or
``/dev/fd/N``), else ``$SBUS_ADDRESS``, else where the broker's embedded default listens
(``$XDG_RUNTIME_DIR/msgbroker/sbus.socket``).

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
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

from msgbroker.cli import CommandError
from msgbroker.plugins.ssmp.cli import _reason, render_payload

from .blocking import ADDRESS_ENV, BlockingSbusClient, SbusConnectionClosed, default_address
from .codec import DEFAULT_MAX_PACKET, Publish

NAME = "sbus"
HELP = "sbus client: subscribe to key patterns, publish, ask for credentials"


def render_key(key: bytes) -> str:
    """``key`` for a terminal line: as :func:`render_payload`, and no spaces."""
    return render_payload(key).replace(" ", "\\x20")


def render_message(message: Publish) -> str:
    """One line for ``sub``: ``KEY PAYLOAD``."""
    return f"{render_key(message.key)} {render_payload(message.payload)}"


# -- arguments --------------------------------------------------------------------------------


def _bytes(value: str) -> bytes:
    return os.fsencode(value)  # the bytes the user typed, even if not valid UTF-8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument(
        "-a", "--address", metavar="ADDRESS",
        help=f"the bus: a socket path, @NAME, /dev/unix/abstract/HEX or /dev/fd/N "
        f"[${ADDRESS_ENV}, else the broker's default: $XDG_RUNTIME_DIR/msgbroker/sbus.socket]",
    )  # fmt: skip
    group.add_argument(
        "--timeout", metavar="SECONDS", type=float, default=10.0,
        help="how long to wait to connect and for the broker [10]",
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = actions.add_parser(
        "sub", parents=[common], help="print messages whose key matches PATTERN until Ctrl-C",
        description="Print each message as 'KEY PAYLOAD' until Ctrl-C. In a PATTERN, * matches "
        "up to the next /, a trailing / matches everything below, and '' matches every key.",
    )  # fmt: skip
    sub.add_argument("patterns", nargs="+", type=_bytes, metavar="PATTERN")
    pub = actions.add_parser("pub", parents=[common], help="publish MESSAGE with routing key KEY")
    pub.add_argument("key", type=_bytes, metavar="KEY")
    pub.add_argument(
        "message", type=_bytes, metavar="MESSAGE", help="the payload; - reads lines from stdin"
    )
    actions.add_parser(
        "whoami", parents=[common], help="print this process's credentials as the broker sees "
        "them (!/cred/GID/UID/PID)",
    )  # fmt: skip


# -- running ----------------------------------------------------------------------------------


def _where(args: argparse.Namespace) -> str:
    return str(args.address or default_address())


def connect(args: argparse.Namespace) -> BlockingSbusClient:
    where = _where(args)
    try:
        return BlockingSbusClient(where, timeout=args.timeout)
    except TimeoutError:
        raise CommandError(f"cannot connect to {where}: no answer within {args.timeout:g} s")
    except OSError as e:
        raise CommandError(f"cannot connect to {where}: {_reason(e)}") from None
    except ValueError as e:  # an address parse_address refuses
        raise CommandError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        if args.action == "sub":
            return _subscribe(client, args)
        if args.action == "pub":
            _publish(client, args)
        else:
            sys.stdout.write(client.whoami().decode("utf-8", "backslashreplace") + "\n")
    except (SbusConnectionClosed, TimeoutError) as e:
        raise CommandError(f"{_where(args)}: {_reason(e)}{_hint(args)}") from None
    finally:
        client.close()
    return 0


def _hint(args: argparse.Namespace) -> str:
    """Why the broker may have closed the connection: what sbus disconnects a client for."""
    if args.action == "sub" and any(p.startswith(b"!/cred/") for p in args.patterns):
        return " (a !/cred/ pattern must carry this process's credentials: see whoami)"
    if args.action == "pub" and len(args.key) + len(args.message) + 5 > DEFAULT_MAX_PACKET:
        return f" (a message over the broker's maximum packet, {DEFAULT_MAX_PACKET} bytes?)"
    return ""


def _publish(client: BlockingSbusClient, args: argparse.Namespace) -> None:
    for payload in _payloads(args.message, sys.stdin.buffer):
        client.publish(args.key, payload)
    client.sync()  # the broker has it all (or closed the connection: an error)


def _payloads(message: bytes, stdin: BinaryIO) -> Iterator[bytes]:
    if message != b"-":
        yield message
        return
    for raw in stdin:
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if line:  # an empty line is no message, as for ssmp and mm2 pub
            yield line


def _subscribe(client: BlockingSbusClient, args: argparse.Namespace) -> int:
    try:
        for pattern in args.patterns:
            client.subscribe(pattern)
        credentials = client.whoami()  # the subscriptions are in force now
        shown = " ".join(render_key(p) or "''" for p in args.patterns)
        sys.stderr.write(
            f"msgbroker: subscribed to {shown} as {render_key(credentials)} "
            f"on {_where(args)}; Ctrl-C to stop\n"
        )
        sys.stderr.flush()
        for packet in client.messages():
            if isinstance(packet, Publish):
                sys.stdout.write(render_message(packet) + "\n")
                sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0  # messages() only ends by raising
