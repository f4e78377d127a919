"""The built-in broker actions, ``0.0.1.0/24`` (DECISIONS.md), routed like any plugin's.

| action | request | reply |
|---|---|---|
| ``0.0.1.1`` login | ``{"id", "scheme", "credential"?}`` | Ok / 0x21 (+ ``{"schemes": [...]}``) |
| ``0.0.1.2`` subscribe | ``{"topic", "presence"?}`` | Ok / 0x20; already subscribed is Ok |
| ``0.0.1.3`` unsubscribe | ``{"topic"}`` | Ok / 0x24 |
| ``0.0.1.4`` publish | ``{"topic", "data" or "data_b64"}`` | Ok |
| ``0.0.1.5`` unicast | ``{"to", "data" or "data_b64"}`` | Ok / 0x24 |
| ``0.0.1.6`` broadcast | ``{"data" or "data_b64"}`` | Ok |

Refusals by ``msgbroker_authorize`` answer ``0x23 Forbidden``; anonymous (``.``) sessions
may publish and unicast only, like SSMP's: subscribe, unsubscribe and broadcast are
``0x23 Forbidden`` for them.

A refused login is answered ``login-failure-delay`` seconds late (the connection holds
what follows it meanwhile, see :class:`~.protocol.STMPServerSession`), so one connection
cannot guess credentials fast. A subscribe over a configured limit (``max-subscriptions``,
``max-topics``) is ``0x23 Forbidden`` with ``{"error": "<limit> reached"}``.

A login accepted under another identity than the one asked for (an auth hook may choose
it) answers Ok with ``{"id": identity}``; a subscribe to a topic the session is already in
is Ok, and with ``"presence": true`` turns presence on (and sends the snapshot) if it was
off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from msgbroker.auth import Accept, AuthResult, LoginRequest
from msgbroker.errors import (
    AlreadySubscribed,
    LimitExceeded,
    NoSuchIdentity,
    NotAllowed,
    NotSubscribed,
)
from msgbroker.message import Kind, Message

from .codec import Status
from .payloads import data_from
from .router import Reply, Router, RouteRequest, STMPStatusError

if TYPE_CHECKING:
    from msgbroker.session import Session

ACTIONS = {
    "login": "0.0.1.1",
    "subscribe": "0.0.1.2",
    "unsubscribe": "0.0.1.3",
    "publish": "0.0.1.4",
    "unicast": "0.0.1.5",
    "broadcast": "0.0.1.6",
}


def _sender(session: Session) -> str:
    """The identity messages go out under; routes run only once the session logged in."""
    if session.identity is None:  # not reached: the protocol answers requests before login
        raise STMPStatusError(Status.UNAUTHORIZED)
    return session.identity


def _fields(request: RouteRequest, *required: str) -> dict[str, Any]:
    payload = request.payload
    if not isinstance(payload, dict):
        raise STMPStatusError(Status.BAD_REQUEST)
    for name in required:
        if not isinstance(payload.get(name), str) or not payload[name]:
            raise STMPStatusError(Status.BAD_REQUEST)
    return payload


def _data(request: RouteRequest, fields: dict[str, Any]) -> bytes:
    try:
        return data_from(fields, request.encoding)
    except ValueError:
        raise STMPStatusError(Status.BAD_REQUEST) from None


def _authorize(request: RouteRequest, action: str, topic: str | None) -> None:
    broker = request.broker
    if broker.authorizes and not broker.authorize(request.session, action, topic):
        raise STMPStatusError(Status.FORBIDDEN)


def login(request: RouteRequest) -> Any:
    fields = _fields(request, "id", "scheme")
    session, broker = request.session, request.broker
    if session.identity is not None:
        raise STMPStatusError(Status.BAD_REQUEST, {"error": "already logged in"})
    credential = fields.get("credential")
    if isinstance(credential, str):
        credential = credential.encode()
    elif credential is not None and not isinstance(credential, bytes):
        raise STMPStatusError(Status.BAD_REQUEST)
    connection = session.data["stmp"]
    login_request = LoginRequest(
        protocol="stmp",
        identity=fields["id"],
        scheme=fields["scheme"],
        credential=credential,
        host=session.host,
        tls_names=connection.certificate_names(),
    )
    answer: Deferred[Any] = Deferred()

    def decided(result: AuthResult) -> None:
        if not isinstance(result, Accept):
            # the server session answers it login-failure-delay late
            schemes = {"schemes": list(broker.enabled_schemes)}
            answer.errback(STMPStatusError(Status.UNAUTHORIZED, schemes))
            return
        connection.login_accepted(request.encoding)
        # an auth hook chose another identity: tell the client
        answer.callback({"id": result.identity} if result.identity != fields["id"] else None)

    # the scheme may answer later (password: a hash checked in a thread): then the login
    # is answered later, and what the client sent after it waits (the session holds it)
    broker.begin_login(session, login_request, decided)
    if not answer.called:
        return answer
    outcome: list[Any] = []
    answer.addBoth(outcome.append)
    if isinstance(outcome[0], Failure):
        outcome[0].raiseException()
    return outcome[0]


def subscribe(request: RouteRequest) -> Any:
    fields = _fields(request, "topic")
    topic, presence = fields["topic"], bool(fields.get("presence", False))
    _authorize(request, "subscribe", topic)
    session = request.session
    hub = request.broker.hub
    try:
        snapshot = hub.subscribe(session, topic, presence)
    except AlreadySubscribed:  # Ok; asking for presence now turns it on
        snapshot = hub.watch(session, topic) if presence else []
    except LimitExceeded as e:  # "not allowed" (DECISIONS.md, Limits); says which limit
        raise STMPStatusError(Status.FORBIDDEN, {"error": f"{e.limit} reached"}) from None
    except NotAllowed:  # anonymous: refused like SSMP's 405, with one status throughout
        raise STMPStatusError(Status.FORBIDDEN) from None

    def send_snapshot() -> None:
        for message in snapshot:
            frame = message.encoded(session.encode)
            if frame is not None:
                session.send(frame)

    return Reply(Status.OK, None, send_snapshot if snapshot else None)


def unsubscribe(request: RouteRequest) -> Any:
    fields = _fields(request, "topic")
    try:
        request.broker.hub.unsubscribe(request.session, fields["topic"])
    except NotSubscribed:
        raise STMPStatusError(Status.NOT_FOUND) from None
    except NotAllowed:
        raise STMPStatusError(Status.FORBIDDEN) from None
    return None


def publish(request: RouteRequest) -> Any:
    fields = _fields(request, "topic")
    topic = fields["topic"]
    _authorize(request, "publish", topic)
    session = request.session
    message = Message(Kind.MCAST, _sender(session), "stmp", topic, _data(request, fields))
    request.broker.hub.multicast(session, message)
    return None


def unicast(request: RouteRequest) -> Any:
    fields = _fields(request, "to")
    target = fields["to"]
    _authorize(request, "unicast", target)
    session = request.session
    message = Message(Kind.UCAST, _sender(session), "stmp", target, _data(request, fields))
    try:
        request.broker.hub.unicast(message)
    except NoSuchIdentity:
        raise STMPStatusError(Status.NOT_FOUND) from None
    return None


def broadcast(request: RouteRequest) -> Any:
    fields = _fields(request)
    _authorize(request, "broadcast", None)
    session = request.session
    message = Message(Kind.BCAST, _sender(session), "stmp", None, _data(request, fields))
    try:
        request.broker.hub.broadcast(session, message)
    except NotAllowed:
        raise STMPStatusError(Status.FORBIDDEN) from None
    return None


def register(router: Router) -> None:
    for name, action in ACTIONS.items():
        router.add(action, globals()[name])
