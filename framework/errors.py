"""Errors shared by the core and the protocols."""

from __future__ import annotations


class MsgbrokerError(Exception):
    """Base class of every error msgbroker raises on purpose."""


class ConfigError(MsgbrokerError):
    """The configuration or the command line is wrong; the message says what, in one line."""


class RemoteProtocolError(MsgbrokerError):
    """The peer broke the protocol's grammar or rules.

    Codecs raise it (sans-IO, like h11's ``RemoteProtocolError``); the Twisted protocol
    answers as its specification says (SSMP: ``400`` and close) and nothing else happens.
    """


class NotAuthorized(RemoteProtocolError):
    """A request the peer may not make (``msgbroker_authorize`` refused it), where the
    protocol's answer is the same as for a broken rule (Micromessage2: an ERROR frame and
    closing); the session closes as ``not authorized``, not as a protocol error."""


class RoutingError(MsgbrokerError):
    """A hub operation that was refused; subclasses say why."""


class NotAllowed(RoutingError):
    """The session may not do this (e.g. an anonymous session subscribing)."""


class AlreadySubscribed(RoutingError):
    """The session already subscribes to this topic."""


class NotSubscribed(RoutingError):
    """The session does not subscribe to this topic."""


class NoSuchIdentity(RoutingError):
    """Nobody is logged in with the target identity."""


class IdentityInUse(RoutingError):
    """The session is already logged in."""


class LimitExceeded(NotAllowed):
    """A configured limit refuses the request (subscriptions per connection, topics in the
    broker, ...). ``limit`` is the setting's name (``max-subscriptions``). Protocols answer
    it as any :class:`NotAllowed`: SSMP ``405``, STMP and Micromessage2 their "not
    allowed" status or ERROR, sbus closes the client; other connections never notice."""

    def __init__(self, limit: str, detail: str = "") -> None:
        super().__init__(f"{limit} reached" + (f": {detail}" if detail else ""))
        self.limit = limit
