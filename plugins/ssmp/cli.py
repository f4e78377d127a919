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
import sys
from typing import Any

from msgbroker.cli import CommandError
from msgbroker.clientkit import cli as kit

from .client import BlockingSSMPClient, Delivery, Presence, SSMPError
from .client_session import DEFAULT_PORT
from .codec import MAX_PAYLOAD, is_valid_id

NAME = "ssmp"
HELP = "SSMP 1.1 client: subscribe, publish, unicast, broadcast"


def render_event(event: Delivery | Presence) -> str:
    if isinstance(event, Presence):
        return f"{event.sender} {'joined' if event.subscribed else 'left'} {event.topic}"
    if event.kind == "MCAST":
        where = event.to
    elif event.kind == "UCAST":
        where = f"@{event.to}"
    else:
        where = "*"
    return f"{event.sender} {where} {kit.render_payload(event.payload)}"


def _id(value: str) -> str:
    if not is_valid_id(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an SSMP id (1-64 of A-Z a-z 0-9 . : @ / _ - + = ~)"
        )
    return value


def _check_payload(payload: bytes) -> bytes:
    if not 0 < len(payload) <= MAX_PAYLOAD:
        raise CommandError(f"a message must be 1 to {MAX_PAYLOAD} bytes, not {len(payload)}")
    return payload


class SSMPCommand(kit.ClientCommand):
    options = (
        kit.HOST,
        kit.port(DEFAULT_PORT, f"broker SSMP port [{DEFAULT_PORT}]"),
        kit.identity(_id),
        *kit.LOGIN,
        *kit.TLS_FILES,
        kit.timeout(),
        kit.tls(),
    )

    def add_actions(self, add: Any) -> None:
        kit.add_topic_sub(add, _id, "PAYLOAD")
        kit.add_send(add, "pub", "send MESSAGE to TOPIC (MCAST)", ("topic", "TOPIC", _id))
        kit.add_send(add, "ucast", "send MESSAGE to client ID", ("target", "ID", _id),
                     text="the payload; - as pub")  # fmt: skip
        bcast = kit.add_send(
            add, "bcast", "send MESSAGE to every client sharing a topic with us",
            text="the payload; - as pub",
            description="BCAST reaches every client that shares at least one topic with the "
            "sender: use --join to subscribe to those topics first.",
        )  # fmt: skip
        bcast.add_argument("--join", action="append", type=_id, default=[], metavar="TOPIC",
                           help="subscribe to TOPIC before broadcasting (repeatable)")  # fmt: skip

    def check(self, args: argparse.Namespace) -> None:
        if args.action != "sub" and args.message != b"-":
            _check_payload(args.message)

    def open(self, args: argparse.Namespace) -> BlockingSSMPClient:
        identity, scheme, credential = self.login(args)
        return BlockingSSMPClient(
            args.host, args.port, identity, scheme, credential,
            ssl_context=kit.ssl_context(args), timeout=args.timeout,
        )  # fmt: skip

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        if not isinstance(error, SSMPError):
            return None
        where, login = self.where(args), args.login
        if error.code == 401:
            offered = (error.payload or b"").decode("ascii", "replace") or "none"
            return (f"{where} refused login as {login!r} with scheme {args.scheme!r} "
                    f"(401; it offers: {offered})")  # fmt: skip
        return f"{where} refused login as {login!r}: {error}"

    def act(self, client: BlockingSSMPClient, args: argparse.Namespace) -> int:
        if args.action == "sub":
            shown = (e for e in client.events() if args.presence or not isinstance(e, Presence))
            return self.follow_topics(args, client, map(render_event, shown))
        for topic in getattr(args, "join", ()):
            client.subscribe(topic)
        for payload in kit.message_lines(args.message, sys.stdin.buffer):
            _check_payload(payload)
            if args.action == "pub":
                client.mcast(args.topic, payload)
            elif args.action == "ucast":
                client.ucast(args.target, payload)
            else:
                client.bcast(payload)
        return 0

    def failed(self, error: Exception, args: argparse.Namespace) -> str | None:
        if not isinstance(error, SSMPError):
            return None
        if error.code == 404 and args.action == "ucast":
            return f"no client is logged in as {args.target!r} (404)"
        if error.code == 405 and args.action in ("bcast", "sub"):
            return f"not allowed as {args.id or 'this identity'} (405)"
        if error.code == 409:
            return "subscribed twice to the same topic (409)"
        return f"the broker answered {error}"


COMMAND = SSMPCommand()
add_arguments, run = COMMAND.add_arguments, COMMAND.run
