"""systemd's readiness protocol (``sd_notify``), as a built-in plugin.

Under a unit with ``Type=notify`` (deploy/msgbroker.service), systemd sets
``NOTIFY_SOCKET`` and waits for the service to say ``READY=1`` before it counts it as
started (and starts the units ordered after it). The broker says it once every listener is
bound and the reactor runs (``msgbroker_broker_started``), and ``STOPPING=1`` when it begins to stop
(``msgbroker_broker_stopping``), each with a ``STATUS=`` line ``systemctl status`` shows.
Without ``NOTIFY_SOCKET`` nothing is sent.

The protocol is one datagram of ``KEY=VALUE`` lines to the unix socket the variable names:
a path, or ``@name`` for Linux's abstract namespace. A few lines here rather than a
dependency. (``vsock:`` addresses, for virtual machines, are not supported: ignored.)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

from msgbroker import hookimpl

if TYPE_CHECKING:
    from twisted.logger import Logger

    from msgbroker import Broker


def _log() -> Logger:
    """The plugin's logger, made on first use: the ``msgbroker`` command line imports this
    module (for its commands) and must not import Twisted."""
    from twisted.logger import Logger

    return Logger(namespace="msgbroker.systemd")


def notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` (``KEY=VALUE`` lines) to the socket ``NOTIFY_SOCKET`` names; False
    when there is none (not run by systemd) or it cannot be reached (said once in the log)."""
    address = environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]  # the abstract namespace
    elif not address.startswith("/"):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except OSError as e:
            _log().warn(
                "cannot tell systemd {state!r}: {error}",
                state=state.split("\n", 1)[0],
                error=e.strerror or str(e),
            )
            return False
    return True


@hookimpl
def msgbroker_broker_started(broker: Broker) -> None:
    where = ", ".join(f"{listener.protocol} {address}" for listener, address in broker.listening)
    state = f"READY=1\nSTATUS=listening: {where or 'nowhere'}"
    # twistd starts the service before the reactor runs: ready means accepting, and
    # stoppable by SIGTERM (whose handler the reactor installs as it starts running)
    when_running = getattr(broker.reactor, "callWhenRunning", None)
    if when_running is None:  # a test's clock
        notify(state)
    else:
        when_running(notify, state)


@hookimpl
def msgbroker_broker_stopping(broker: Broker) -> None:
    notify(
        f"STOPPING=1\nSTATUS=stopping: {len(broker.sessions)} connections get "
        f"{broker.config.shutdown_grace:g} s to flush"
    )
