"""sbus codec, sans-IO: one SOCK_SEQPACKET packet in, one frozen packet out; a packet in,
its bytes out. No Twisted here, and no stream framing: the socket delimits packets, so one
packet is exactly one message.

The four kinds (sbus.txt, "Protocol"; DECISIONS.md, "sbus")::

    SUB <pattern>[\\0<ignored>]      Subscribe
    UNSUB <pattern>[\\0<ignored>]    Unsubscribe
    MSG <key>\\0<payload>            Publish (the NUL is required)
    CMSG <key>[\\0<payload>]         ControlMessage (a client may omit the NUL)

A pattern or key is every byte after the verb's single space up to the first NUL (so it
never contains one; it may be empty). The verb is case-sensitive and followed by exactly
one space that separates it from the key. Anything else — an empty packet, an unknown verb,
a verb without its space (``SUB``, ``MSG``), ``MSG`` without a NUL, a packet longer than the
maximum — is the client's fault: :class:`~msgbroker.errors.RemoteProtocolError`, and the
client is closed (and only it).

Control messages the broker understands are named here (``CMSG`` keys); what they do is the
session's business, not the codec's.
"""

from __future__ import annotations

from attrs import frozen

from msgbroker.errors import RemoteProtocolError

#: the largest packet accepted unless configured (DECISIONS.md); a larger one is an error
DEFAULT_MAX_PACKET = 212_960

#: ``CMSG`` keys: ask for one's credentials; the reply is :func:`whoami_reply`
WHOAMI = b"!/cred/whoami"
#: ``CMSG`` key of a login (ours: sbus has none): ``CMSG !/login\0ID\0SCHEME\0CREDENTIAL``,
#: answered ``CMSG !/login\0ok\0ID`` or, ``login-failure-delay`` late, ``CMSG
#: !/login\0refused`` and the close (:func:`parse_login`, :func:`login_request`)
LOGIN = b"!/login"
LOGIN_OK = b"ok"
LOGIN_REFUSED = b"refused"
#: ``CMSG`` keys: stop / resume receiving one's own messages (DECISIONS.md)
ECHO_OFF = b"echo/off"
ECHO_ON = b"echo/on"
#: ``CMSG`` keys of flood control (sbus.txt, "Flood control"): the most recent one of each
#: group (soft, hard, order) governs the sending client
BLOCKING_SOFT = frozenset(
    b"blocking/soft/" + how for how in (b"queue", b"discard", b"block", b"error")
)
BLOCKING_HARD = frozenset(b"blocking/hard/" + how for how in (b"discard", b"block", b"error"))
ORDER = frozenset(b"order/" + how for how in (b"queue", b"stack", b"random"))
FLOOD_CONTROL = BLOCKING_SOFT | BLOCKING_HARD | ORDER

# -- packets --------------------------------------------------------------------------------


@frozen(slots=True)
class Subscribe:
    """``SUB <pattern>``: deliver messages whose key matches ``pattern`` to this client."""

    pattern: bytes


@frozen(slots=True)
class Unsubscribe:
    """``UNSUB <pattern>``: remove one copy of ``pattern`` from this client's subscriptions."""

    pattern: bytes


@frozen(slots=True)
class Publish:
    """``MSG <key>\\0<payload>``: a message on the bus, from a client or to a subscriber."""

    key: bytes
    payload: bytes = b""


@frozen(slots=True)
class ControlMessage:
    """``CMSG <key>[\\0<payload>]``: to or from the server only, never forwarded. A client's
    ``CMSG`` without a NUL has the empty payload; the broker always writes the NUL."""

    key: bytes
    payload: bytes = b""


Packet = Subscribe | Unsubscribe | Publish | ControlMessage

_SUB = b"SUB"
_UNSUB = b"UNSUB"
_MSG = b"MSG"
_CMSG = b"CMSG"


def parse_packet(data: bytes, max_size: int = DEFAULT_MAX_PACKET) -> Packet:
    """The packet ``data`` (one whole SOCK_SEQPACKET packet) carries.

    RemoteProtocolError when it is empty, longer than ``max_size``, has no space after the
    verb, an unknown verb, or is a ``MSG`` without the NUL ending its key; nothing else
    escapes.
    """
    if not data:
        raise RemoteProtocolError("empty packet")
    if len(data) > max_size:
        raise RemoteProtocolError(f"packet of {len(data)} bytes exceeds {max_size}")
    space = data.find(b" ", 0, 6)  # the longest verb, UNSUB, is 5 bytes
    if space < 0:
        raise RemoteProtocolError(f"no verb in packet {bytes(data[:16])!r}")
    verb = data[:space]
    rest = data[space + 1 :]
    nul = rest.find(b"\0")
    if verb == _MSG:
        if nul < 0:
            raise RemoteProtocolError("MSG without a NUL after its routing key")
        return Publish(bytes(rest[:nul]), bytes(rest[nul + 1 :]))
    if verb == _SUB:
        return Subscribe(bytes(rest if nul < 0 else rest[:nul]))
    if verb == _UNSUB:
        return Unsubscribe(bytes(rest if nul < 0 else rest[:nul]))
    if verb == _CMSG:
        if nul < 0:
            return ControlMessage(bytes(rest))
        return ControlMessage(bytes(rest[:nul]), bytes(rest[nul + 1 :]))
    raise RemoteProtocolError(f"unknown verb {bytes(verb)!r}")


def _checked(what: str, value: bytes) -> bytes:
    if b"\0" in value:
        raise ValueError(f"an sbus {what} cannot contain a NUL: {value!r}")
    return value


def encode_packet(packet: Packet) -> bytes:
    """``packet``'s bytes; ValueError for a pattern or key with a NUL (no packet can carry
    it). ``CMSG`` is always written with its NUL, so :func:`parse_packet` gives ``packet``
    back."""
    if isinstance(packet, Publish):
        return b"MSG " + _checked("routing key", packet.key) + b"\0" + packet.payload
    if isinstance(packet, ControlMessage):
        return b"CMSG " + _checked("routing key", packet.key) + b"\0" + packet.payload
    if isinstance(packet, Subscribe):
        return b"SUB " + _checked("pattern", packet.pattern)
    if isinstance(packet, Unsubscribe):
        return b"UNSUB " + _checked("pattern", packet.pattern)
    raise TypeError(f"not an sbus packet: {packet!r}")


def login_request(identity: str, scheme: str, credential: bytes | None = None) -> ControlMessage:
    """The login ``CMSG``: the identity and scheme (UTF-8, without NULs), then the
    credential (any bytes; none for ``open``)."""
    fields = [identity.encode("utf-8"), scheme.encode("utf-8")]
    if any(b"\0" in field or not field for field in fields):
        raise ValueError("an sbus login's identity and scheme are non-empty, without NULs")
    if credential is not None:
        fields.append(credential)
    return ControlMessage(LOGIN, b"\0".join(fields))


def parse_login(payload: bytes) -> tuple[str, str, bytes | None]:
    """(identity, scheme, credential) of a login ``CMSG``'s payload; RemoteProtocolError
    when the identity or scheme is missing or not UTF-8."""
    identity, _, rest = payload.partition(b"\0")
    scheme, nul, credential = rest.partition(b"\0")
    if not identity or not scheme:
        raise RemoteProtocolError("a login without an identity or a scheme")
    try:
        return identity.decode("utf-8"), scheme.decode("utf-8"), credential if nul else None
    except UnicodeDecodeError:
        raise RemoteProtocolError("a login whose identity or scheme is not UTF-8") from None


def whoami_reply(gid: int, uid: int, pid: int) -> ControlMessage:
    """The answer to ``CMSG !/cred/whoami``: ``CMSG !/cred/whoami\\0!/cred/<gid>/<uid>/<pid>``."""
    return ControlMessage(WHOAMI, b"!/cred/%d/%d/%d" % (gid, uid, pid))
