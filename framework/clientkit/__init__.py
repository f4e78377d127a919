"""msgbroker's client kit: what every protocol's client is built on, once.

A client is its protocol's codec plus a small sans-IO *session*
(:class:`~msgbroker.clientkit.session.ClientSession`: bytes in, events out, timers as
ticks), driven by one of two drivers:

- :mod:`msgbroker.clientkit.protocol`: Twisted (:class:`~.protocol.SessionDriver` and its
  stream glue, :func:`~.protocol.client_endpoint`, :func:`~.protocol.connect_client`,
  :class:`~.protocol.ReconnectingClient`); WebSocket glue in :mod:`.twisted_ws`;
- :mod:`msgbroker.clientkit.blocking`: a plain socket, no reactor
  (:class:`~.blocking.BlockingClient`, TCP/TLS/unix sockets); a WebSocket channel in
  :mod:`.websocket`.

:mod:`.tls` makes TLS contexts for both from the same PEM files; :mod:`.cli` is the
skeleton of a ``msgbroker PROTOCOL ACTION`` command; :mod:`.testing` has the fake server
and reactor thread that client tests run against. The submodules are imported on demand:
a blocking client never imports Twisted's reactor, a Twisted one never the CLI.
"""

from __future__ import annotations

from .session import Answered, ClientSession, ConnectionClosed, Ended, Failed, Timers

__all__ = ["Answered", "ClientSession", "ConnectionClosed", "Ended", "Failed", "Timers"]
