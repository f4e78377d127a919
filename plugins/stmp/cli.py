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
import select
import ssl
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from msgbroker.cli import CommandError
from msgbroker.plugins.ssmp.cli import (
    _credential,
    _default_identity,
    _reason,
    _scheme,
    _ssl_context,
    render_payload,
)

from .client import BlockingSTMPClient, Delivery, STMPConnectionClosed, STMPError
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
    return f"{delivery.sender} {where} {render_payload(delivery.data)}"


def render_value(value: Any) -> str:
    """A decoded reply payload on one line: JSON, with bytes as escaped text."""
    if isinstance(value, bytes):
        return render_payload(value)
    return json.dumps(_printable(value), ensure_ascii=False)


def _printable(value: Any) -> Any:
    if isinstance(value, bytes):
        return render_payload(value)
    if isinstance(value, dict):
        return {str(_printable(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


# -- arguments --------------------------------------------------------------------------------


def _topic(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("a topic cannot be empty")
    return value


def _message(value: str) -> bytes:
    return os.fsencode(value)  # the bytes the user typed, even if not valid UTF-8


def _action(value: str) -> int:
    try:
        return parse_action(int(value) if value.isdigit() else value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an action (a.b.c.d, each 0-255, or a number)"
        ) from None


_OPTIONS: tuple[tuple[str, str, Any, Any, str], ...] = (
    ("--host", "HOST", str, "127.0.0.1", "broker address [127.0.0.1]"),
    ("--port", "PORT", int, None,
     f"broker STMP port [{DEFAULT_PORT}; {DEFAULT_WS_PORT} with --ws]"),
    ("--path", "PATH", str, "/", "WebSocket resource, with --ws [/]"),
    ("--id", "ID", str, None,
     "identity to log in as [cli-PID-RANDOM; with the cert scheme CN/cli-PID-RANDOM]"),
    ("--scheme", "SCHEME", str, None,
     "login scheme: open, secret, cert [secret with --secret-file, cert with --cert, else open]"),
    ("--secret-file", "PATH", str, None, "file holding the shared secret (secret scheme)"),
    ("--ca", "PEM", str, None, "CA certificate to verify the broker with [system CAs]"),
    ("--cert", "PEM", str, None, "client certificate, for the cert scheme (implies --tls)"),
    ("--key", "PEM", str, None, "client private key [in --cert]"),
    ("--timeout", "SECONDS", float, 10.0, "how long to wait to connect and for replies [10]"),
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    for flag, metavar, kind, default, text in _OPTIONS:
        group.add_argument(flag, metavar=metavar, type=kind, default=default, help=text)
    group.add_argument("--ws", action="store_true", help="speak WebSocket (text frames)")
    group.add_argument("--tls", action="store_true", help="connect with TLS (wss with --ws)")
    group.add_argument(
        "--encoding", choices=sorted(_ENCODINGS), default="json",
        help="payload encoding of the broker actions and of call [json]",
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = actions.add_parser(
        "sub", parents=[common], help="print messages sent to TOPIC until Ctrl-C",
        description="Print each message as 'SENDER TOPIC DATA' (unicasts to this client as "
        "'SENDER @ID DATA', broadcasts as 'SENDER * DATA') until Ctrl-C.",
    )  # fmt: skip
    sub.add_argument("topics", nargs="+", type=_topic, metavar="TOPIC")
    sub.add_argument("--presence", action="store_true", help="also print 'ID joined|left TOPIC'")
    pub = actions.add_parser("pub", parents=[common], help="publish MESSAGE to TOPIC")
    pub.add_argument("topic", type=_topic, metavar="TOPIC")
    pub.add_argument(
        "message", type=_message, metavar="MESSAGE", help="the data; - reads lines from stdin"
    )
    call = actions.add_parser(
        "call", parents=[common], help="send a request to ACTION and print the reply",
        description="Send a request to ACTION (dotted, e.g. 10.1.0.1) carrying PAYLOAD_JSON "
        "(encoded as --encoding; none if omitted), print the reply's status and payload. "
        f"Exit status 0 for Ok, {CALL_FAILED} for any other status.",
    )  # fmt: skip
    call.add_argument("target", type=_action, metavar="ACTION")
    call.add_argument("payload", nargs="?", metavar="PAYLOAD_JSON", help="the request payload")
    call.add_argument(
        "--raw", action="store_true", help="send PAYLOAD_JSON as raw bytes (encoding 5) instead"
    )


# -- running ----------------------------------------------------------------------------------


def _port(args: argparse.Namespace) -> int:
    if args.port is not None:
        return int(args.port)
    return DEFAULT_WS_PORT if args.ws else DEFAULT_PORT


def _where(args: argparse.Namespace) -> str:
    return f"{args.host}:{_port(args)}"


def connect(args: argparse.Namespace) -> BlockingSTMPClient:
    scheme = _scheme(args)
    identity = args.id or _default_identity(args, scheme)
    where = _where(args)
    try:
        return BlockingSTMPClient(
            args.host, _port(args), identity, scheme, _credential(args, scheme),
            ws=args.ws, path=args.path, ssl_context=_ssl_context(args),
            encoding=_ENCODINGS[args.encoding], timeout=args.timeout,
        )  # fmt: skip
    except STMPError as e:
        if e.status == Status.VERSION_NOT_SUPPORTED:
            raise CommandError(f"{where} does not speak STMP 0.1 ({e})") from None
        if e.status == Status.UNAUTHORIZED:
            offered = e.payload.get("schemes") if isinstance(e.payload, dict) else None
            shown = " ".join(map(str, offered)) if isinstance(offered, list) else "none"
            raise CommandError(
                f"{where} refused login as {identity!r} with scheme {scheme!r} "
                f"(0x21 Unauthorized; it offers: {shown or 'none'})"
            ) from None
        if e.local:
            raise CommandError(f"{where}: no reply within {args.timeout:g} s") from None
        raise CommandError(f"{where} refused login as {identity!r}: {e}") from None
    except ssl.SSLError as e:
        raise CommandError(f"TLS with {where} failed: {e.reason or e}") from None
    except STMPConnectionClosed as e:
        raise CommandError(f"{where}: {_reason(e)}") from None
    except OSError as e:
        raise CommandError(f"cannot connect to {where}: {_reason(e)}") from None
    except ValueError as e:  # a credential that is not UTF-8
        raise CommandError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    payload = _call_payload(args) if args.action == "call" else None
    client = connect(args)
    try:
        if args.action == "sub":
            return _subscribe(client, args)
        if args.action == "call":
            return _call(client, args, payload)
        _publish(client, args)
    except STMPError as e:
        if e.local:
            raise CommandError(f"{_where(args)}: no reply within {args.timeout:g} s") from None
        raise CommandError(f"the broker answered {e}") from None
    except STMPConnectionClosed as e:
        raise CommandError(f"{_where(args)}: {_reason(e)}") from None
    finally:
        client.close()
    return 0


def _call_payload(args: argparse.Namespace) -> Any:
    """(payload, encoding) for ``call``, checked before connecting."""
    text = args.payload
    if text is None:
        return None, None
    if args.raw:
        return os.fsencode(text), Encoding.RAW
    try:
        value = json.loads(text)
    except ValueError as e:
        raise CommandError(f"PAYLOAD_JSON is not JSON: {e}") from None
    return value, _ENCODINGS[args.encoding]


def _call(client: BlockingSTMPClient, args: argparse.Namespace, payload: Any) -> int:
    value, encoding = payload
    response = client.request(args.target, value, encoding, timeout=args.timeout)
    line = f"{response.status:#04x} {status_name(response.status)}"
    if response.status == Status.REQUEST_TIMEOUT and not response.payload:
        line += f" (no reply within {args.timeout:g} s)"
    sys.stdout.write(line + "\n")
    if response.encoding != Encoding.NONE:
        sys.stdout.write(render_value(decoded(response)) + "\n")
    sys.stdout.flush()
    return 0 if response.status == Status.OK else CALL_FAILED


def _publish(client: BlockingSTMPClient, args: argparse.Namespace) -> None:
    if args.message != b"-":
        client.publish(args.topic, args.message)
        return
    for line in _stdin_lines(client, sys.stdin.buffer):
        client.publish(args.topic, line)


def _stdin_lines(client: BlockingSTMPClient, stdin: BinaryIO) -> Iterator[bytes]:
    """Non-empty lines from ``stdin``, keeping the connection alive (heartbeat, server
    pings) while waiting for them."""
    try:
        fd = stdin.fileno()
    except (OSError, ValueError):  # not a real file (tests): plain reads
        for raw in stdin:
            line = raw.removesuffix(b"\n").removesuffix(b"\r")
            if line:
                yield line
        return
    pending = b""
    interval = (client.heartbeat or HEARTBEAT) / 2
    while True:
        ready, _, _ = select.select([fd], [], [], interval)
        if not ready:
            client.poll()
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.removesuffix(b"\r")
            if line:
                yield line
        client.poll()
    line = pending.removesuffix(b"\r")
    if line:
        yield line


def _subscribe(client: BlockingSTMPClient, args: argparse.Namespace) -> int:
    try:
        for topic in args.topics:
            client.subscribe(topic, presence=args.presence)
        sys.stderr.write(
            f"msgbroker: subscribed to {' '.join(args.topics)} as {client.identity} "
            f"on {_where(args)}; Ctrl-C to stop\n"
        )
        sys.stderr.flush()
        for delivery in client.deliveries():
            if delivery.kind in ("subscribe", "unsubscribe") and not args.presence:
                continue
            sys.stdout.write(render_delivery(delivery, client.identity) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0  # deliveries() only ends by raising
