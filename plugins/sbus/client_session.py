"""The sbus client connection, sans-IO (:class:`SbusClientSession`), what both sbus clients
send (:class:`SbusVerbs`), and their error. The Twisted client (:mod:`.client`) and the
blocking client (:mod:`.blocking`) drive the session through :mod:`msgbroker.clientkit`;
import from :mod:`msgbroker.plugins.sbus.client`.

The units are packets. Sending writes one at once (sbus answers nothing), except
``CMSG !/cred/whoami``, which returns a token the broker's answer fulfils: that round trip
is the clients' barrier, as the broker handles one client's packets in order. ``MSG``
packets from the broker are :class:`~.codec.Publish` events, other ``CMSG`` packets
:class:`~.codec.ControlMessage` events; anything outside the protocol (malformed, too long,
a ``SUB``/``UNSUB``) ends the session.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from msgbroker.clientkit.reconnect import Replay
from msgbroker.clientkit.session import ClientSession, ConnectionClosed, SessionAttribute
from msgbroker.errors import RemoteProtocolError

from . import codec, flood
from .codec import ControlMessage, Publish


class SbusConnectionClosed(ConnectionClosed):
    """The connection ended (or was never usable): the broker closed it, it sent something
    outside the protocol, or this client was closed."""


class SbusLoginRefused(SbusConnectionClosed):
    """The broker refused the login (``CMSG !/login\\0refused``); it closes the connection.
    It never says whether the identity or the credential was wrong."""


def flood_controls(
    soft: str | None = None, hard: str | None = None, order: str | None = None
) -> list[bytes]:
    """The ``CMSG`` keys choosing the given flood-control behaviours (sbus.txt, "Flood
    control"): ``soft`` one of queue, discard, block, error; ``hard`` one of discard,
    block, error; ``order`` one of queue, stack, random. ValueError for anything else,
    before anything is sent."""
    keys = []
    for group, choice, allowed in (
        ("blocking/soft/", soft, flood.SOFT),
        ("blocking/hard/", hard, flood.HARD),
        ("order/", order, flood.ORDER),
    ):
        if choice is None:
            continue
        if choice not in allowed:
            raise ValueError(f"{group}{choice} is no flood control; choose from {allowed}")
        keys.append(f"{group}{choice}".encode("ascii"))
    return keys


def server_packet(data: bytes, max_packet: int) -> Publish | ControlMessage:
    """What the broker sent: a ``MSG`` or a ``CMSG``; RemoteProtocolError for anything
    else (malformed, too long, or a ``SUB``/``UNSUB``, which only clients send)."""
    packet = codec.parse_packet(data, max_packet)
    if not isinstance(packet, Publish | ControlMessage):
        raise RemoteProtocolError(f"a server never sends {type(packet).__name__} packets")
    return packet


class SbusClientSession(ClientSession):
    """One sbus client connection's state (see the module docstring); ``max_packet`` is
    the largest packet accepted from the broker."""

    closed_error = SbusConnectionClosed

    def __init__(self, max_packet: int = codec.DEFAULT_MAX_PACKET) -> None:
        super().__init__()
        self.max_packet = max_packet
        self._whoami: deque[int] = deque()  # tokens of the whoami requests not answered yet
        # tokens of the logins not answered yet, with what each asked
        self._logins: deque[tuple[int, tuple[str, str, bytes | None]]] = deque()
        self._login: tuple[str, str, bytes | None] | None = None  # the accepted login
        self._patterns: list[bytes] = []  # subscribed, in order (the broker counts copies)
        self._controls: dict[bytes, bytes] = {}  # the echo and flood choices, by group

    def send(self, packet: codec.Packet) -> None:
        """Write ``packet``; ValueError (before anything is sent) for a NUL in a key."""
        data = codec.encode_packet(packet)
        self.check_open()
        self._send(data)
        if isinstance(packet, codec.Subscribe):
            self._patterns.append(packet.pattern)
        elif isinstance(packet, codec.Unsubscribe):
            if packet.pattern in self._patterns:
                self._patterns.remove(packet.pattern)
        elif isinstance(packet, ControlMessage) and _choice(packet.key):
            self._controls[packet.key.rpartition(b"/")[0]] = packet.key

    def replay(self) -> list[Replay]:
        """The accepted login (ours: :meth:`login`), the echo and flood-control choices, the
        patterns subscribed to, then a :meth:`whoami` (answered once the broker has them
        all)."""
        items = [
            Replay(f"control {key.decode('ascii')}", _sending(ControlMessage(key)))
            for key in self._controls.values()
        ]
        items += [
            Replay(f"subscribe {pattern.decode('utf-8', 'backslashreplace')}",
                   _sending(codec.Subscribe(pattern)))
            for pattern in self._patterns
        ]  # fmt: skip
        if items:
            items.append(Replay("whoami", lambda session, now: session.whoami()))
        if self._login is not None:
            login = self._login
            items.insert(
                0, Replay(f"login {login[0]}", lambda session, now: session.login(*login), True)
            )
        return items

    def whoami(self) -> int:
        """``CMSG !/cred/whoami``, answered with this client's credentials as the broker
        sees them, ``b"!/cred/GID/UID/PID"`` (longer through a relay)."""
        self.check_open()
        token = self._token()
        self._whoami.append(token)
        self._send(codec.encode_packet(ControlMessage(codec.WHOAMI)))
        return token

    def login(self, identity: str, scheme: str, credential: bytes | None = None) -> int:
        """``CMSG !/login``: log in as ``identity`` with ``scheme`` (``password``,
        ``secret``...), answered with the identity the broker accepted (a ``str``), or
        failed with :class:`SbusLoginRefused` (the broker then closes the connection)."""
        packet = codec.login_request(identity, scheme, credential)  # ValueError first
        self.check_open()
        token = self._token()
        self._logins.append((token, (identity, scheme, credential)))
        self._send(codec.encode_packet(packet))
        return token

    def _received(self, data: bytes, now: float) -> None:
        packet = server_packet(data, self.max_packet)
        if isinstance(packet, ControlMessage) and packet.key == codec.WHOAMI and self._whoami:
            self._answer(self._whoami.popleft(), packet.payload)
        elif isinstance(packet, ControlMessage) and packet.key == codec.LOGIN and self._logins:
            token, asked = self._logins.popleft()
            answer, _, identity = packet.payload.partition(b"\0")
            if answer == codec.LOGIN_OK:
                self._login = asked
                self._answer(token, identity.decode("utf-8", "replace"))
            else:
                self._fail(token, SbusLoginRefused("login refused"))
        else:
            self._emit(packet)

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        self._end(SbusConnectionClosed(f"protocol error from the broker: {error}"))


def _choice(key: bytes) -> bool:
    """Whether ``key`` is a control message that sets something for the connection."""
    return key in (codec.ECHO_ON, codec.ECHO_OFF) or key in codec.FLOOD_CONTROL


def _sending(packet: codec.Packet) -> Callable[[SbusClientSession, float], None]:
    return lambda session, now: session.send(packet)


class SbusVerbs:
    r"""What both clients send, the same way: each verb is one packet through ``_send``;
    :meth:`whoami` is :meth:`_perform`\ ed — a Deferred in the Twisted client, the answer
    itself in the blocking one."""

    session: SbusClientSession

    def _send(self, packet: codec.Packet) -> None:
        raise NotImplementedError

    def _perform(self, ask: Callable[[], int]) -> Any:
        raise NotImplementedError

    max_packet = SessionAttribute("the largest packet accepted from the broker")

    def whoami(self) -> Any:
        """This client's credentials as the broker sees them, ``b"!/cred/GID/UID/PID"``
        (longer through a relay); :class:`SbusConnectionClosed` if the connection ends
        first."""
        # the session asked at the time: after a reconnection it is another one
        return self._perform(lambda: self.session.whoami())  # noqa: PLW0108

    def login(self, identity: str, scheme: str, credential: bytes | None = None) -> Any:
        """Log in as ``identity`` (ours: sbus has no login): the identity the broker
        accepted; :class:`SbusLoginRefused` when refused (the broker closes the
        connection)."""
        return self._perform(lambda: self.session.login(identity, scheme, credential))

    def subscribe(self, pattern: bytes) -> None:
        self._send(codec.Subscribe(pattern))

    def unsubscribe(self, pattern: bytes) -> None:
        self._send(codec.Unsubscribe(pattern))

    def publish(self, key: bytes, payload: bytes) -> None:
        self._send(Publish(key, payload))

    def control(self, key: bytes, payload: bytes = b"") -> None:
        """Send ``CMSG key\\0payload`` to the broker (never forwarded to anyone)."""
        self._send(ControlMessage(key, payload))

    def echo(self, on: bool) -> None:
        """Whether this client receives its own messages (on by default)."""
        self.control(codec.ECHO_ON if on else codec.ECHO_OFF)

    def flood(
        self, soft: str | None = None, hard: str | None = None, order: str | None = None
    ) -> None:
        """What the broker does when this client cannot keep up; see :func:`flood_controls`."""
        for key in flood_controls(soft, hard, order):
            self.control(key)
