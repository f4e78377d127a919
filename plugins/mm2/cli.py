"""``msgbroker mm2 ...``: Micromessage2 from the command line, on the blocking client.

::

    msgbroker mm2 sub news                            # prints "news hello" per message
    msgbroker mm2 sub prices --filter 'price>=N10'    # only what passes every filter
    msgbroker mm2 sub jobs --queue workers            # one worker of the group gets each
    msgbroker mm2 pub news hello --property price=N12 --property 'name=THello%20there'
    msgbroker mm2 pub @alice 'psst'                   # a unicast: alice's sub prints "@ID psst"
    tail -f log | msgbroker mm2 pub news -            # one message per line

Printed lines (``sub``): ``DESTINATION PAYLOAD``, or ``DESTINATION [KEY=VALUE ...] PAYLOAD``
when the message has properties. A unicast to this client shows its sender as the
destination, ``@SENDER``. Values are typed as on the wire and as ``--property`` takes
them: ``N12`` (number), ``D1413198000.0`` (date, epoch seconds), ``THello%20there`` (text,
URL-encoded, so a line splits on its spaces). The payload is shown as UTF-8 with backslash
escapes, as by ``msgbroker ssmp``, and a leading ``[`` of a message without properties as
``\\x5b``, so every line reads one way.

``sub`` announces itself on stderr once the broker has its subscriptions: COMMAND frames get
no reply, so it unicasts an empty message to itself and waits for it (never printed).
``pub`` waits until the broker acknowledged what it sent (with ``batch-ack``, negotiated by
default) before it exits.
"""

from __future__ import annotations

import argparse
import itertools
import os
import ssl
import sys
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from msgbroker.cli import CommandError
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.ssmp.cli import _default_identity, _reason, _ssl_context, render_payload

from .blocking import BlockingMM2Client
from .client_common import (
    DEFAULT_OPTIONAL,
    DEFAULT_PORT,
    DEFAULT_REQUIRED,
    ExtensionSpec,
    Message,
    MM2ConnectionClosed,
    MM2Error,
    MM2HandshakeRefused,
    MM2ServerError,
    MM2Timeout,
)
from .codec import Filter, PropertyValue, encode_value, parse_filter, parse_value
from .properties import FIELD_RE, is_valid_name

NAME = "mm2"
HELP = "Micromessage2 client: subscribe (filters, queue groups), publish with properties"


def render_message(message: Message) -> str:
    """One line for ``sub``: ``DESTINATION [KEY=VALUE ...] PAYLOAD``."""
    payload = render_payload(message.payload)
    if message.properties:
        shown = " ".join(f"{k}={encode_value(v)}" for k, v in message.properties.items())
        return f"{message.destination} [{shown}] {payload}"
    if payload.startswith("["):
        payload = "\\x5b" + payload[1:]
    return f"{message.destination} {payload}"


# -- arguments --------------------------------------------------------------------------------


def _destination(value: str) -> str:
    if not value or not is_valid_name(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a destination (1-255 printable ASCII)")
    return value


def _identity(value: str) -> str:
    if not value or not is_valid_name(value) or value.startswith("@"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an identity (1-255 printable ASCII, not starting with @)"
        )
    return value


def _filter(value: str) -> Filter:
    try:
        return parse_filter(value)
    except (RemoteProtocolError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e} (KEY OP VALUE, e.g. 'price>=N10')")


def _property(value: str) -> tuple[str, PropertyValue]:
    key, equals, text = value.partition("=")
    if not equals or FIELD_RE.fullmatch(key) is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not KEY=VALUE with a key of a-z 0-9 - (e.g. price=N12)"
        )
    try:
        return key, parse_value(text)
    except RemoteProtocolError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e} (N12, D1413198000.0 or Ttext)")


def _window(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"{value!r} is not a window of 1 to 65535 messages")
    return int(value)


def _message(value: str) -> bytes:
    return os.fsencode(value)  # the bytes the user typed, even if not valid UTF-8


class _Properties(argparse.Action):
    """Collects ``--property`` into a dict; a key given twice is a usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        key, value = values
        properties = dict(getattr(namespace, self.dest) or {})
        if key in properties:
            parser.error(f"argument --property: {key!r} given twice")
        properties[key] = value
        setattr(namespace, self.dest, properties)


_OPTIONS: tuple[tuple[str, str, Any, Any, str], ...] = (
    ("--host", "HOST", str, "127.0.0.1", "broker address [127.0.0.1]"),
    ("--port", "PORT", int, DEFAULT_PORT, f"broker Micromessage2 port [{DEFAULT_PORT}]"),
    ("--id", "ID", _identity, None,
     "identity to log in as [cli-PID-RANDOM; with --cert CN/cli-PID-RANDOM]"),
    ("--ca", "PEM", str, None, "CA certificate to verify the broker with [system CAs]"),
    ("--cert", "PEM", str, None,
     "client certificate: the broker logs in with the cert scheme (implies --tls)"),
    ("--key", "PEM", str, None, "client private key [in --cert]"),
    ("--timeout", "SECONDS", float, 10.0, "how long to wait to connect and for acks [10]"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    for flag, metavar, kind, default, text in _OPTIONS:
        group.add_argument(flag, metavar=metavar, type=kind, default=default, help=text)
    group.add_argument("--tls", action="store_true", help="connect with TLS")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = actions.add_parser(
        "sub", parents=[common], help="print messages sent to DESTINATION until Ctrl-C",
        description="Print each message as 'DESTINATION [KEY=VALUE ...] PAYLOAD' (unicasts to "
        "this client as '@SENDER ...') until Ctrl-C.",
    )  # fmt: skip
    sub.add_argument("destinations", nargs="+", type=_destination, metavar="DESTINATION")
    sub.add_argument(
        "--filter", dest="filters", action="append", type=_filter, default=[], metavar="EXPR",
        help="only messages whose property passes KEY OP VALUE (OP: = != < <= > >= & ~; "
        "VALUE: N12, D1413198000.0, Ttext); repeatable, all must pass",
    )  # fmt: skip
    sub.add_argument(
        "--queue", metavar="GROUP", help="share the messages with the group's other members"
    )
    acks = sub.add_mutually_exclusive_group()
    acks.add_argument("--ack", action="store_true", help="require ack: one message at a time")
    acks.add_argument(
        "--batch-ack", type=_window, metavar="N",
        help="require batch-ack with a window of N messages [batch-ack if offered, 10]",
    )  # fmt: skip
    pub = actions.add_parser(
        "pub", parents=[common], help="publish DATA to DESTINATION (@ID: to that client)"
    )
    pub.add_argument("destination", type=_destination, metavar="DESTINATION")
    pub.add_argument(
        "message", type=_message, metavar="DATA", help="the payload; - reads lines from stdin"
    )
    pub.add_argument(
        "--property", dest="properties", action=_Properties, type=_property, default={},
        metavar="KEY=VALUE", help="a property: N12, D1413198000.0 or Ttext; repeatable",
    )  # fmt: skip


# -- running ----------------------------------------------------------------------------------


def _where(args: argparse.Namespace) -> str:
    return f"{args.host}:{args.port}"


def extensions(args: argparse.Namespace) -> tuple[Sequence[ExtensionSpec], Sequence[ExtensionSpec]]:
    """The (required, optional) extensions of the handshake: ``--ack`` and ``--batch-ack``
    are required (a broker without them refuses at once), else batch-ack if offered."""
    if getattr(args, "ack", False):
        return (*DEFAULT_REQUIRED, "ack"), ()
    window = getattr(args, "batch_ack", None)
    if window is not None:
        return (*DEFAULT_REQUIRED, f"batch-ack:max-count={window}"), ()
    return DEFAULT_REQUIRED, DEFAULT_OPTIONAL


def connect(args: argparse.Namespace) -> BlockingMM2Client:
    identity = args.id or _default_identity(args, "cert" if args.cert else "open")
    required, optional = extensions(args)
    where = _where(args)
    try:
        return BlockingMM2Client(
            args.host, args.port, identity, required, optional,
            ssl_context=_ssl_context(args), timeout=args.timeout,
        )  # fmt: skip
    except ssl.SSLError as e:
        raise CommandError(f"TLS with {where} failed: {e.reason or e}") from None
    except MM2HandshakeRefused as e:
        raise CommandError(f"{where}: handshake refused: {e}") from None
    except MM2ServerError as e:
        raise CommandError(f"{where} refused {identity!r}: {e.text}") from None
    except (MM2ConnectionClosed, MM2Timeout) as e:
        raise CommandError(f"{where}: {_reason(e)}") from None
    except OSError as e:
        raise CommandError(f"cannot connect to {where}: {_reason(e)}") from None
    except ValueError as e:  # e.g. a certificate's CN that makes no identity
        raise CommandError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    client = connect(args)
    try:
        if args.action == "sub":
            return _subscribe(client, args)
        _publish(client, args)
    except MM2ServerError as e:
        raise CommandError(f"{_where(args)}: {e}") from None
    except (MM2Error, OSError) as e:
        raise CommandError(f"{_where(args)}: {_reason(e)}") from None
    finally:
        client.close()
    return 0


def _publish(client: BlockingMM2Client, args: argparse.Namespace) -> None:
    for payload in _payloads(args.message, sys.stdin.buffer):
        client.publish(args.destination, payload, args.properties or None)
    if not client.wait_acked():
        raise CommandError(f"{_where(args)}: no ack within {args.timeout:g} s")


def _payloads(message: bytes, stdin: BinaryIO) -> Iterator[bytes]:
    if message != b"-":
        yield message
        return
    for raw in stdin:
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if line:  # an empty line is no message
            yield line


def _subscribe(client: BlockingMM2Client, args: argparse.Namespace) -> int:
    identity = client.session.hello.identity
    try:
        for destination in args.destinations:
            client.subscribe(destination, args.queue, args.filters)
        early = _settle(client, identity)
        sys.stderr.write(
            f"msgbroker: subscribed to {' '.join(args.destinations)} as {identity} "
            f"on {_where(args)}; Ctrl-C to stop\n"
        )
        sys.stderr.flush()
        for message in itertools.chain(early, client.messages()):
            sys.stdout.write(render_message(message) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0  # messages() only ends by raising


def _settle(client: BlockingMM2Client, identity: str) -> list[Message]:
    """Unicast an empty message to ourselves and read until it is back: the subscriptions
    written before are in force then (DECISIONS.md). What arrived first is returned."""
    client.unicast(identity, b"")
    early: list[Message] = []
    while True:
        message = client.next_message(client.timeout)
        if message is None:
            raise MM2Timeout(f"the broker did not answer within {client.timeout:g} s")
        if message.destination == f"@{identity}":  # only we hold our identity
            return early
        early.append(message)
