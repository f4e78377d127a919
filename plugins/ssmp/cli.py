"""``msgbroker ssmp ...``: SSMP from the command line, on the blocking client.

::

    msgbroker ssmp sub news                 # prints "SENDER TOPIC PAYLOAD" per message
    msgbroker ssmp pub news 'hello there'   # from another terminal
    msgbroker ssmp ucast alice 'hi'         # alice's sub prints "SENDER @alice hi"
    tail -f log | msgbroker ssmp pub news - # one MCAST per line

Printed lines: MCAST ``SENDER TOPIC PAYLOAD``; UCAST ``SENDER @TARGET PAYLOAD``; BCAST
``SENDER * PAYLOAD``; with ``--presence``, ``SENDER joined|left TOPIC``. Payloads are shown
as UTF-8, with backslash escapes for invalid bytes, non-printable characters and ``\\``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import ssl
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from msgbroker.cli import CommandError

from .client import BlockingSSMPClient, Delivery, Presence, SSMPConnectionClosed, SSMPError
from .codec import MAX_PAYLOAD, is_valid_id

NAME = "ssmp"
HELP = "SSMP 1.1 client: subscribe, publish, unicast, broadcast"

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def render_payload(payload: bytes) -> str:
    """``payload`` for a terminal line: UTF-8 text, escapes for the rest (``\\xNN`` for
    bytes that are not UTF-8, ``\\n``, ``\\t``, ``\\uNNNN`` ... for unprintable characters,
    ``\\\\`` for a backslash), so the output is one line and unambiguous."""
    text = payload.decode("utf-8", "surrogateescape")
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, from surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def render_event(event: Delivery | Presence) -> str:
    if isinstance(event, Presence):
        return f"{event.sender} {'joined' if event.subscribed else 'left'} {event.topic}"
    if event.kind == "MCAST":
        where = event.to
    elif event.kind == "UCAST":
        where = f"@{event.to}"
    else:
        where = "*"
    return f"{event.sender} {where} {render_payload(event.payload)}"


# -- arguments --------------------------------------------------------------------------------


def _id(value: str) -> str:
    if not is_valid_id(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an SSMP id (1-64 of A-Z a-z 0-9 . : @ / _ - + = ~)"
        )
    return value


def _message(value: str) -> bytes:
    return os.fsencode(value)  # the bytes the user typed, even if not valid UTF-8


_OPTIONS: tuple[tuple[str, str, Any, Any, str], ...] = (
    ("--host", "HOST", str, "127.0.0.1", "broker address [127.0.0.1]"),
    ("--port", "PORT", int, 4444, "broker SSMP port [4444]"),
    (
        "--id",
        "ID",
        _id,
        None,
        "identity to log in as [cli-PID-RANDOM; with the cert scheme CN/cli-PID-RANDOM]",
    ),
    (
        "--scheme",
        "SCHEME",
        str,
        None,
        "login scheme: open, secret, cert [secret with --secret-file, cert with --cert, else open]",
    ),
    ("--secret-file", "PATH", str, None, "file holding the shared secret (secret scheme)"),
    ("--ca", "PEM", str, None, "CA certificate to verify the broker with [system CAs]"),
    ("--cert", "PEM", str, None, "client certificate, for the cert scheme (implies --tls)"),
    ("--key", "PEM", str, None, "client private key [in --cert]"),
    ("--timeout", "SECONDS", float, 10.0, "how long to wait to connect and for replies [10]"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    for flag, metavar, kind, default, text in _OPTIONS:
        group.add_argument(flag, metavar=metavar, type=kind, default=default, help=text)
    group.add_argument("--tls", action="store_true", help="connect with TLS")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub = actions.add_parser(
        "sub",
        parents=[common],
        help="print messages sent to TOPIC until Ctrl-C",
        description="Print each message as 'SENDER TOPIC PAYLOAD' (unicasts to this client as "
        "'SENDER @ID PAYLOAD', broadcasts as 'SENDER * PAYLOAD') until Ctrl-C.",
    )
    sub.add_argument("topics", nargs="+", type=_id, metavar="TOPIC")
    sub.add_argument("--presence", action="store_true", help="also print 'ID joined|left TOPIC'")
    pub = actions.add_parser("pub", parents=[common], help="send MESSAGE to TOPIC (MCAST)")
    pub.add_argument("topic", type=_id, metavar="TOPIC")
    pub.add_argument(
        "message", type=_message, metavar="MESSAGE", help="the payload; - reads lines from stdin"
    )
    ucast = actions.add_parser("ucast", parents=[common], help="send MESSAGE to client ID")
    ucast.add_argument("target", type=_id, metavar="ID")
    ucast.add_argument("message", type=_message, metavar="MESSAGE", help="the payload; - as pub")
    bcast = actions.add_parser(
        "bcast",
        parents=[common],
        help="send MESSAGE to every client sharing a topic with us",
        description="BCAST reaches every client that shares at least one topic with the sender: "
        "use --join to subscribe to those topics first.",
    )
    bcast.add_argument("message", type=_message, metavar="MESSAGE", help="the payload; - as pub")
    bcast.add_argument(
        "--join",
        action="append",
        type=_id,
        default=[],
        metavar="TOPIC",
        help="subscribe to TOPIC before broadcasting (repeatable)",
    )


# -- running ----------------------------------------------------------------------------------


def _scheme(args: argparse.Namespace) -> str:
    if args.scheme:
        return str(args.scheme)
    if args.secret_file:
        return "secret"
    return "cert" if args.cert else "open"


def _default_identity(args: argparse.Namespace, scheme: str) -> str:
    generated = f"cli-{os.getpid()}-{secrets.token_hex(2)}"
    if scheme == "cert" and args.cert:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        try:
            with open(args.cert, "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
        except (OSError, ValueError) as e:
            raise CommandError(f"cannot read certificate {args.cert}: {e}") from None
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if names:
            common_name = names[0].value
            if isinstance(common_name, bytes):
                common_name = common_name.decode("utf-8", "replace")
            return f"{common_name}/{generated}"
    return generated


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not (args.tls or args.ca or args.cert):
        return None
    try:
        context = ssl.create_default_context(cafile=args.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if args.cert:
            context.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as e:
        raise CommandError(f"cannot set up TLS: {e}") from None
    return context


def _credential(args: argparse.Namespace, scheme: str) -> bytes | None:
    if not args.secret_file:
        if scheme == "secret":
            raise CommandError("the secret scheme needs --secret-file")
        return None
    try:
        with open(args.secret_file, "rb") as f:
            return f.read().removesuffix(b"\n").removesuffix(b"\r")
    except OSError as e:
        raise CommandError(f"cannot read secret file {args.secret_file}: {e.strerror}") from None


def connect(args: argparse.Namespace) -> BlockingSSMPClient:
    scheme = _scheme(args)
    identity = args.id or _default_identity(args, scheme)
    where = f"{args.host}:{args.port}"
    try:
        return BlockingSSMPClient(
            args.host,
            args.port,
            identity,
            scheme,
            _credential(args, scheme),
            ssl_context=_ssl_context(args),
            timeout=args.timeout,
        )
    except SSMPError as e:
        if e.code == 401:
            offered = (e.payload or b"").decode("ascii", "replace") or "none"
            raise CommandError(
                f"{where} refused login as {identity!r} with scheme {scheme!r} "
                f"(401; it offers: {offered})"
            ) from None
        raise CommandError(f"{where} refused login as {identity!r}: {e}") from None
    except ssl.SSLError as e:
        raise CommandError(f"TLS with {where} failed: {e.reason or e}") from None
    except OSError as e:
        raise CommandError(f"cannot connect to {where}: {_reason(e)}") from None
    except ValueError as e:  # e.g. a certificate's CN that is not an SSMP id
        raise CommandError(str(e)) from None


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _payloads(message: bytes, stdin: BinaryIO) -> Iterator[bytes]:
    if message != b"-":
        yield message
        return
    for raw in stdin:
        line = raw.removesuffix(b"\n").removesuffix(b"\r")
        if line:  # SSMP has no empty payload
            yield line


def _check_payload(payload: bytes) -> bytes:
    if not 0 < len(payload) <= MAX_PAYLOAD:
        raise CommandError(f"a message must be 1 to {MAX_PAYLOAD} bytes, not {len(payload)}")
    return payload


def run(args: argparse.Namespace) -> int:
    if args.action != "sub" and args.message != b"-":
        _check_payload(args.message)
    client = connect(args)
    try:
        if args.action == "sub":
            return _subscribe(client, args)
        _send(client, args)
    except SSMPError as e:
        raise CommandError(_describe(e, args)) from None
    except (SSMPConnectionClosed, TimeoutError) as e:
        raise CommandError(f"{args.host}:{args.port}: {_reason(e)}") from None
    finally:
        client.close()
    return 0


def _send(client: BlockingSSMPClient, args: argparse.Namespace) -> None:
    _join(client, args)
    for payload in _payloads(args.message, sys.stdin.buffer):
        _check_payload(payload)
        if args.action == "pub":
            client.mcast(args.topic, payload)
        elif args.action == "ucast":
            client.ucast(args.target, payload)
        else:
            client.bcast(payload)


def _join(client: BlockingSSMPClient, args: argparse.Namespace) -> None:
    for topic in getattr(args, "join", ()):
        client.subscribe(topic)


def _subscribe(client: BlockingSSMPClient, args: argparse.Namespace) -> int:
    try:
        for topic in args.topics:
            client.subscribe(topic, presence=args.presence)
        sys.stderr.write(
            f"msgbroker: subscribed to {' '.join(args.topics)} as {client.identity} "
            f"on {args.host}:{args.port}; Ctrl-C to stop\n"
        )
        sys.stderr.flush()
        for event in client.events():
            if isinstance(event, Presence) and not args.presence:
                continue
            sys.stdout.write(render_event(event) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0  # events() only ends by raising


def _describe(error: SSMPError, args: argparse.Namespace) -> str:
    if error.code == 404 and args.action == "ucast":
        return f"no client is logged in as {args.target!r} (404)"
    if error.code == 405 and args.action in ("bcast", "sub"):
        return f"not allowed as {args.id or 'this identity'} (405)"
    if error.code == 409:
        return "subscribed twice to the same topic (409)"
    return f"the broker answered {error}"
