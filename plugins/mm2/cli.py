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
import sys
from collections.abc import Sequence
from typing import Any

from msgbroker.cli import CommandError
from msgbroker.clientkit import cli as kit
from msgbroker.errors import RemoteProtocolError

from . import client_common as common
from .blocking import BlockingMM2Client
from .client_common import DEFAULT_OPTIONAL, DEFAULT_PORT, DEFAULT_REQUIRED, ExtensionSpec, Message
from .codec import Filter, PropertyValue, encode_value, parse_filter, parse_value
from .plugin import COMMAND as REGISTERED
from .properties import FIELD_RE, is_valid_name

NAME = REGISTERED.NAME
HELP = REGISTERED.HELP


def render_message(message: Message) -> str:
    """One line for ``sub``: ``DESTINATION [KEY=VALUE ...] PAYLOAD``."""
    payload = kit.render_payload(message.payload)
    if message.properties:
        shown = " ".join(f"{k}={encode_value(v)}" for k, v in message.properties.items())
        return f"{message.destination} [{shown}] {payload}"
    if payload.startswith("["):
        payload = "\\x5b" + payload[1:]
    return f"{message.destination} {payload}"


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


def extensions(args: argparse.Namespace) -> tuple[Sequence[ExtensionSpec], Sequence[ExtensionSpec]]:
    """The (required, optional) extensions of the handshake: ``--ack`` and ``--batch-ack``
    are required (a broker without them refuses at once), else batch-ack if offered."""
    if getattr(args, "ack", False):
        return (*DEFAULT_REQUIRED, "ack"), ()
    window = getattr(args, "batch_ack", None)
    if window is not None:
        return (*DEFAULT_REQUIRED, f"batch-ack:max-count={window}"), ()
    return DEFAULT_REQUIRED, DEFAULT_OPTIONAL


class MM2Command(kit.ClientCommand):
    options = (
        kit.HOST,
        kit.port(DEFAULT_PORT, f"broker Micromessage2 port [{DEFAULT_PORT}]"),
        kit.identity(_identity, "identity to log in as [cli-PID-RANDOM; with --cert "
                     "CN/cli-PID-RANDOM]"),
        kit.CA,
        kit.cert("client certificate: the broker logs in with the cert scheme (implies --tls)"),
        kit.KEY,
        kit.timeout("how long to wait to connect and for acks [10]"),
        kit.tls(),
    )  # fmt: skip

    def add_actions(self, add: Any) -> None:
        sub = kit.add_sub(
            add, "destinations", "DESTINATION", _destination,
            description="Print each message as 'DESTINATION [KEY=VALUE ...] PAYLOAD' (unicasts "
            "to this client as '@SENDER ...') until Ctrl-C.",
        )  # fmt: skip
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
        pub = kit.add_send(
            add, "pub", "publish DATA to DESTINATION (@ID: to that client)",
            ("destination", "DESTINATION", _destination), metavar="DATA",
        )  # fmt: skip
        pub.add_argument(
            "--property", dest="properties", action=_Properties, type=_property, default={},
            metavar="KEY=VALUE", help="a property: N12, D1413198000.0 or Ttext; repeatable",
        )  # fmt: skip

    def open(self, args: argparse.Namespace) -> BlockingMM2Client:
        args.login = args.id or kit.default_identity(args, "cert" if args.cert else "open")
        required, optional = extensions(args)
        return BlockingMM2Client(
            args.host, args.port, args.login, required, optional,
            ssl_context=kit.ssl_context(args), timeout=args.timeout,
        )  # fmt: skip

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        where = self.where(args)
        if isinstance(error, common.MM2HandshakeRefused):
            return f"{where}: handshake refused: {error}"
        if isinstance(error, common.MM2ServerError):
            return f"{where} refused {args.login!r}: {error.text}"
        if isinstance(error, common.MM2ConnectionClosed | common.MM2Timeout):
            return f"{where}: {kit.reason(error)}"
        return None

    def act(self, client: BlockingMM2Client, args: argparse.Namespace) -> int:
        if args.action == "sub":
            early: list[Message] = []
            return self.follow(
                args,
                lambda: self._subscribe(client, args, early),
                (render_message(m) for m in itertools.chain(early, client.messages())),
                client,
            )
        for payload in kit.message_lines(args.message, sys.stdin.buffer):
            client.publish(args.destination, payload, args.properties or None)
        if not client.wait_acked():
            raise CommandError(f"{self.where(args)}: no ack within {args.timeout:g} s")
        return 0

    @staticmethod
    def _subscribe(
        client: BlockingMM2Client, args: argparse.Namespace, early: list[Message]
    ) -> tuple[str, str]:
        identity = client.session.hello.identity
        for destination in args.destinations:
            client.subscribe(destination, args.queue, args.filters)
        early.extend(_settle(client, identity))
        return " ".join(args.destinations), identity

    def failed(self, error: Exception, args: argparse.Namespace) -> str | None:
        if isinstance(error, common.MM2ServerError):
            return f"{self.where(args)}: {error}"
        if isinstance(error, common.MM2Error | OSError):
            return f"{self.where(args)}: {kit.reason(error)}"
        return None


COMMAND = MM2Command()
add_arguments, run = COMMAND.add_arguments, COMMAND.run


def _settle(client: BlockingMM2Client, identity: str) -> list[Message]:
    """Unicast an empty message to ourselves and read until it is back: the subscriptions
    written before are in force then (DECISIONS.md). What arrived first is returned."""
    client.unicast(identity, b"")
    early: list[Message] = []
    while True:
        message = client.next_message(client.timeout)
        if message is None:
            raise common.MM2Timeout(f"the broker did not answer within {client.timeout:g} s")
        if message.destination == f"@{identity}":  # only we hold our identity
            return early
        early.append(message)
