"""Why a connection closed: one enum for every protocol.

``Session.close(reason, detail)`` takes a :class:`CloseReason`; the detail (what the peer
got wrong, which limit) is free text for logs. ``msgbroker_session_closed`` receives the
reason, and the journal records ``session.close_text`` (the reason, then ``: detail``).
docs/architecture.md has the table of reasons; a test keeps it equal to this enum.
"""

from __future__ import annotations

from enum import StrEnum


class CloseReason(StrEnum):
    """Why a session ended (a ``str``: its value is what logs and the journal show)."""

    #: the peer closed the connection, or the network lost it
    PEER = "closed by peer"
    #: the peer asked to end the session (SSMP ``CLOSE``, sbus ``close``)
    REQUESTED = "close requested"
    #: no successful login within ``--login-timeout``
    LOGIN_TIMEOUT = "login timeout"
    #: the login was refused (after ``--login-failure-delay``)
    LOGIN_REFUSED = "login refused"
    #: nothing arrived for two keepalive intervals
    KEEPALIVE_TIMEOUT = "keepalive timeout"
    #: the peer did not read its output (its byte budget, or the broker's, was spent)
    SLOW_CONSUMER = "slow consumer"
    #: the same identity logged in on another connection
    KICKED = "kicked"
    #: the broker is stopping
    SHUTDOWN = "shutdown"
    #: the peer broke the protocol (the detail says how)
    PROTOCOL_ERROR = "protocol error"
    #: a limit was reached where the protocol has no other answer than closing
    LIMIT_EXCEEDED = "limit exceeded"
    #: a request was not allowed where the protocol's answer is closing
    NOT_AUTHORIZED = "not authorized"
    #: the peer speaks a version the broker does not
    VERSION_NOT_SUPPORTED = "version not supported"
    #: the peer's own flood-control choice (sbus ``error`` policies) ended it
    FLOOD_CONTROL = "flood control"


#: reasons whose connection is aborted at once rather than flushed and closed: the peer does
#: not read (its buffer would never drain)
ABORTED = frozenset({CloseReason.SLOW_CONSUMER})
