"""``msgbroker stmp ...``: STMP from the command line, on the blocking client.

::

    msgbroker stmp sub news                      # prints "SENDER TOPIC DATA" per message
    msgbroker stmp pub news 'hello there'        # from another terminal
    tail -f log | msgbroker stmp pub news -      # one publish per line
    msgbroker stmp call 10.1.0.1 '{"q": 1}'      # any action: prints status and reply
    msgbroker stmp --help                        # (options go after the action)

Over TCP (binary serialization, port 4445) by default; ``--ws`` speaks WebSocket (text
serialization, port 4446), ``--tls`` adds TLS to either (``--ws --tls`` is wss). The
broker actions' payloads are JSON unless ``--encoding msgpack``.

Printed lines (``sub``): a publish ``SENDER TOPIC DATA``; a unicast to this client
``SENDER @ID DATA``; a broadcast ``SENDER * DATA``; with ``--presence``,
``SENDER joined|left TOPIC``. Data is shown as UTF-8 with backslash escapes, as by
``msgbroker ssmp``.

``call`` prints the status (``0x00 Ok``, ``0x24 NotFound``, ...) and, on the next line, the
decoded reply payload, if any (JSON; msgpack bytes and binary payloads as escaped text).
Its exit status is 0 for Ok and 3 for any other status, the local 0x25 RequestTimeout
included; 1 as for every command when the broker cannot be reached or refuses the login.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from msgbroker.cli import CommandError
from msgbroker.clientkit import cli as kit

from .client import BlockingSTMPClient, Delivery, STMPError
from .client_common import DEFAULT_PORT, DEFAULT_WS_PORT, HEARTBEAT, decoded, status_name
from .codec import Encoding, Status, parse_action

NAME = "stmp"
HELP = "STMP 0.1 client: subscribe, publish, call an action (TCP or WebSocket)"

#: exit status of ``call`` when the reply is not Ok
CALL_FAILED = 3
_ENCODINGS = {"json": Encoding.JSON, "msgpack": Encoding.MSGPACK}


def render_delivery(delivery: Delivery, identity: str | None) -> str:
    if delivery.kind in ("subscribe", "unsubscribe"):
        verb = "joined" if delivery.kind == "subscribe" else "left"
        return f"{delivery.sender} {verb} {delivery.topic}"
    if delivery.kind == "ucast":
        where = f"@{identity}"
    elif delivery.kind == "bcast":
        where = "*"
    else:
        where = str(delivery.topic)
    return f"{delivery.sender} {where} {kit.render_payload(delivery.data)}"


def render_value(value: Any) -> str:
    """A decoded reply payload on one line: JSON, with bytes as escaped text."""
    if isinstance(value, bytes):
        return kit.render_payload(value)
    return json.dumps(_printable(value), ensure_ascii=False)


def _printable(value: Any) -> Any:
    if isinstance(value, bytes):
        return kit.render_payload(value)
    if isinstance(value, dict):
        return {str(_printable(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _topic(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("a topic cannot be empty")
    return value


def _action(value: str) -> int:
    try:
        return parse_action(int(value) if value.isdigit() else value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an action (a.b.c.d, each 0-255, or a number)"
        ) from None


def _port(args: argparse.Namespace) -> int:
    if args.port is not None:
        return int(args.port)
    return DEFAULT_WS_PORT if args.ws else DEFAULT_PORT


class STMPCommand(kit.ClientCommand):
    options = (
        kit.HOST,
        kit.port(None, f"broker STMP port [{DEFAULT_PORT}; {DEFAULT_WS_PORT} with --ws]"),
        kit.Option(("--path",), {"metavar": "PATH", "default": "/",
                                 "help": "WebSocket resource, with --ws [/]"}),
        kit.identity(),
        *kit.LOGIN,
        *kit.TLS_FILES,
        kit.timeout(),
        kit.Option(("--ws",), {"action": "store_true", "help": "speak WebSocket (text frames)"}),
        kit.tls("connect with TLS (wss with --ws)"),
        kit.Option(("--encoding",), {"choices": sorted(_ENCODINGS), "default": "json",
                                     "help": "payload encoding of the broker actions and of "
                                     "call [json]"}),
    )  # fmt: skip

    def add_actions(self, add: Any) -> None:
        kit.add_topic_sub(add, _topic, "DATA")
        kit.add_send(add, "pub", "publish MESSAGE to TOPIC", ("topic", "TOPIC", _topic),
                     text="the data; - reads lines from stdin")  # fmt: skip
        call = add(
            "call", help="send a request to ACTION and print the reply",
            description="Send a request to ACTION (dotted, e.g. 10.1.0.1) carrying PAYLOAD_JSON "
            "(encoded as --encoding; none if omitted), print the reply's status and payload. "
            f"Exit status 0 for Ok, {CALL_FAILED} for any other status.",
        )  # fmt: skip
        call.add_argument("target", type=_action, metavar="ACTION")
        call.add_argument("payload", nargs="?", metavar="PAYLOAD_JSON", help="the request payload")
        call.add_argument("--raw", action="store_true",
                          help="send PAYLOAD_JSON as raw bytes (encoding 5) instead")  # fmt: skip

    def where(self, args: argparse.Namespace) -> str:
        return f"{args.host}:{_port(args)}"

    def check(self, args: argparse.Namespace) -> None:
        """``call``'s (payload, encoding), checked before connecting."""
        args.request = None, None
        if args.action != "call" or args.payload is None:
            return
        if args.raw:
            args.request = os.fsencode(args.payload), Encoding.RAW
            return
        try:
            args.request = json.loads(args.payload), _ENCODINGS[args.encoding]
        except ValueError as e:
            raise CommandError(f"PAYLOAD_JSON is not JSON: {e}") from None

    def open(self, args: argparse.Namespace) -> BlockingSTMPClient:
        identity, scheme, credential = self.login(args)
        return BlockingSTMPClient(
            args.host, _port(args), identity, scheme, credential, ws=args.ws, path=args.path,
            ssl_context=kit.ssl_context(args), encoding=_ENCODINGS[args.encoding],
            timeout=args.timeout,
        )  # fmt: skip

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        if not isinstance(error, STMPError):
            return None
        where = self.where(args)
        if error.status == Status.VERSION_NOT_SUPPORTED:
            return f"{where} does not speak STMP 0.1 ({error})"
        if error.status == Status.UNAUTHORIZED:
            offered = error.payload.get("schemes") if isinstance(error.payload, dict) else None
            shown = " ".join(map(str, offered)) if isinstance(offered, list) else "none"
            return (f"{where} refused login as {args.login!r} with scheme {args.scheme!r} "
                    f"(0x21 Unauthorized; it offers: {shown or 'none'})")  # fmt: skip
        if error.local:
            return f"{where}: no reply within {args.timeout:g} s"
        return f"{where} refused login as {args.login!r}: {error}"

    def act(self, client: BlockingSTMPClient, args: argparse.Namespace) -> int:
        if args.action == "sub":
            presence = ("subscribe", "unsubscribe")
            return self.follow_topics(args, client, (
                render_delivery(d, client.identity)
                for d in client.deliveries() if args.presence or d.kind not in presence
            ))  # fmt: skip
        if args.action == "call":
            return self._call(client, args)
        interval = (client.heartbeat or HEARTBEAT) / 2  # stdin may stay silent long
        for line in kit.message_lines(args.message, sys.stdin.buffer, client.poll, interval):
            client.publish(args.topic, line)
        return 0

    @staticmethod
    def _call(client: BlockingSTMPClient, args: argparse.Namespace) -> int:
        value, encoding = args.request
        response = client.request(args.target, value, encoding, timeout=args.timeout)
        line = f"{response.status:#04x} {status_name(response.status)}"
        if response.status == Status.REQUEST_TIMEOUT and not response.payload:
            line += f" (no reply within {args.timeout:g} s)"
        sys.stdout.write(line + "\n")
        if response.encoding != Encoding.NONE:
            sys.stdout.write(render_value(decoded(response)) + "\n")
        sys.stdout.flush()
        return 0 if response.status == Status.OK else CALL_FAILED

    def failed(self, error: Exception, args: argparse.Namespace) -> str | None:
        if not isinstance(error, STMPError):
            return None
        if error.local:
            return f"{self.where(args)}: no reply within {args.timeout:g} s"
        return f"the broker answered {error}"


COMMAND = STMPCommand()
add_arguments, run = COMMAND.add_arguments, COMMAND.run
