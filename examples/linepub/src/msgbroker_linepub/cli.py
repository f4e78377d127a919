"""``msgbroker linepub ...``: linepub from the command line, on the client kit's command
skeleton (the same one ``msgbroker ssmp`` uses)::

    msgbroker linepub sub news
    msgbroker linepub pub news 'hello there'
"""

from __future__ import annotations

import argparse
from typing import Any

from msgbroker.clientkit import cli as kit

from .blocking import BlockingLinepubClient
from .client_session import DEFAULT_PORT, LinepubError
from .plugin import COMMAND as REGISTERED

NAME = REGISTERED.NAME
HELP = REGISTERED.HELP


class LinepubCommand(kit.ClientCommand):
    options = (
        kit.HOST,
        kit.port(DEFAULT_PORT, f"broker linepub port [{DEFAULT_PORT}]"),
        kit.identity(),
        *kit.LOGIN,
        kit.timeout(),
    )

    def add_actions(self, add: Any) -> None:
        add("sub", help="print every message on TOPIC").add_argument("topic")
        pub = add("pub", help="send TEXT to TOPIC")
        pub.add_argument("topic")
        pub.add_argument("text")

    def open(self, args: argparse.Namespace) -> BlockingLinepubClient:
        identity, scheme, credential = self.login(args)
        return BlockingLinepubClient(
            args.host, args.port, identity, scheme, credential, timeout=args.timeout
        )

    def act(self, client: BlockingLinepubClient, args: argparse.Namespace) -> int:
        if args.action == "pub":
            client.publish(args.topic, args.text)
            return 0
        client.subscribe(args.topic)
        while True:
            delivery = client.next_delivery()
            if delivery is not None:
                print(f"{delivery.sender} {delivery.topic} {delivery.text}", flush=True)

    def refused(self, error: Exception, args: argparse.Namespace) -> str | None:
        if isinstance(error, LinepubError):
            return f"{self.where(args)}: {error}"
        return None


COMMAND = LinepubCommand()
add_arguments, run = COMMAND.add_arguments, COMMAND.run
