"""Twisted's TCP server transport, lighter per connection.

Twisted's ``tcp.Server`` stores, per connection, a log prefix and a repr string made at
accept (about 160 bytes for the two) and the socket's bound ``fileno`` method (72 bytes).
:class:`LeanServer` makes each when asked instead: the log prefix when Twisted logs a
connection's event (it asks once per reactor event on the connection: one short string
format), the repr when something prints it, ``fileno`` when the reactor registers the
socket. Nothing else differs; :func:`use_lean_server` puts it under a listening port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import tcp


def _no_fileno() -> int:
    return -1


class LeanServer(tcp.Server):
    """``tcp.Server`` that keeps no per-connection strings or bound methods it can make
    when asked (see the module docstring)."""

    # Twisted's __init__ assigns these and connectionLost deletes ``fileno``: the setters
    # and the deleter drop what they are given, the getters make it
    def _get_logstr(self) -> str:
        return f"{self._getLogPrefix(self.protocol)},{self.sessionno},{self.hostname}"

    def _get_repstr(self) -> str:
        port = self.server._realPortNumber if self.server is not None else self.client[1]
        protocol = getattr(self, "protocol", None)
        name = type(protocol).__name__ if protocol is not None else "Connection"
        return f"<{name} #{self.sessionno} on {port}>"

    def _get_fileno(self) -> Callable[[], int]:
        # (getattr, not __dict__: reading __dict__ would make the instance a dict of its own)
        sock = getattr(self, "socket", None)
        return sock.fileno if sock is not None else _no_fileno

    def _drop(self, value: Any = None) -> None:
        pass

    logstr = property(_get_logstr, _drop)
    repstr = property(_get_repstr, _drop)
    fileno = property(_get_fileno, _drop, _drop)


def use_lean_server(port: Any) -> None:
    """Accept ``port``'s connections as :class:`LeanServer` (a plain TCP port only: TLS is a
    protocol wrapper over it, so it benefits too; another kind of port is left alone)."""
    if type(port) is tcp.Port and port.transport is tcp.Server:
        port.transport = LeanServer
