"""What the STMP client session (:mod:`.client_session`) is made of, with no state of its
own: default ports and timeouts, errors, :class:`Delivery`, request ids and late replies,
request payloads, the version check, the wires (how messages travel: :class:`BinaryWire` on
TCP, :class:`WebSocketWire` in WebSocket messages). :mod:`msgbroker.plugins.stmp.client`
re-exports the public names; import from there.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable
from typing import Any

from attrs import frozen

from msgbroker.clientkit.session import ConnectionClosed
from msgbroker.errors import RemoteProtocolError

from . import codec, payloads
from .codec import Encoding, Message, Notify, Request, Response, Status

DEFAULT_PORT = 4445
DEFAULT_WS_PORT = 4446
#: heartbeat interval (s): a ping every interval; the connection is given up after two
#: intervals without hearing anything from the server
HEARTBEAT = 30.0
#: default request timeout (s): a little over the broker's 30 s route timeout, so its 0x34
#: GatewayTimeout arrives before the client gives up with a local 0x25
REQUEST_TIMEOUT = 35.0
#: versions offered in the version check, preferred first
VERSIONS: tuple[tuple[int, int], ...] = (codec.VERSION,)
#: a timed-out request's id is not reused for this long (s), unless its late reply came
LATE_REPLY_WINDOW = 300.0


# -- errors --------------------------------------------------------------------------------------


def status_name(status: int) -> str:
    """``0x21`` -> ``"Unauthorized"``; user-defined statuses (0x80-0xFF) -> ``"status 0x80"``."""
    try:
        name = Status(status).name
    except ValueError:
        return f"status {status:#04x}"
    return "".join(part.capitalize() for part in name.split("_"))


class STMPError(Exception):
    """A request was answered with ``status`` other than Ok. ``payload`` is the reply's
    payload decoded by its encoding (e.g. ``{"schemes": [...]}`` for a refused login),
    the raw bytes if it does not decode, or ``None`` when there is none. ``local`` is True
    for the 0x25 RequestTimeout the client reports itself when no reply came in time."""

    def __init__(self, status: int, payload: Any = None, local: bool = False) -> None:
        super().__init__(status, payload)
        self.status = status
        self.payload = payload
        self.local = local
        #: a local timeout is worth trying again when reconnecting; a refusal is not
        self.transient = local

    def __str__(self) -> str:
        text = f"{self.status:#04x} {status_name(self.status)}"
        if self.local:
            text += " (no reply in time)"
        if self.payload is not None and self.payload != b"":
            shown = self.payload
            if isinstance(shown, bytes):
                shown = shown.decode("utf-8", "backslashreplace")
            elif not isinstance(shown, str):
                try:
                    shown = json.dumps(shown, ensure_ascii=False)
                except (TypeError, ValueError):
                    shown = repr(shown)
            text += f": {shown}"
        return text


class STMPConnectionClosed(ConnectionClosed):
    """The connection ended (or was never usable) before the request was answered."""


# -- values ------------------------------------------------------------------------------------


@frozen
class Delivery:
    """A message the broker routed to this client (notify ``0.0.1.16``): ``kind`` is
    ``mcast``, ``ucast``, ``bcast``, or the presence events ``subscribe``/``unsubscribe``
    (``data`` is ``b""`` for those); ``topic`` is ``None`` for unicasts and broadcasts."""

    sender: str
    kind: str
    topic: str | None
    data: bytes


def delivery_of(notify: Notify) -> Delivery:
    """The :class:`Delivery` a ``0.0.1.16`` notify carries; ``ValueError`` if it is not one."""
    if notify.action != payloads.DELIVERY:
        raise ValueError(f"action {codec.action_to_str(notify.action)} is not a delivery")
    fields = payloads.decode_payload(notify.payload, notify.encoding)
    return Delivery(*payloads.parse_delivery(fields, notify.encoding))


def request_message(
    ident: int, action: int | str, payload: Any, encoding: int | None, default: int
) -> Request:
    """A request carrying ``payload``: ``None`` is no payload (encoding 0); bytes go as they
    are (already encoded) with ``encoding`` (default: raw); anything else is serialized
    with ``encoding`` (default: ``default``). ``ValueError`` for a bad action or payload."""
    number = codec.parse_action(action)
    if payload is None:
        return Request(ident, number, Encoding.NONE, b"")
    if isinstance(payload, bytes | bytearray | memoryview):
        chosen = Encoding.RAW if encoding is None else encoding
        if chosen == Encoding.NONE:
            raise ValueError("encoding 0 carries no payload")
        return Request(ident, number, chosen, bytes(payload))
    chosen = default if encoding is None else encoding
    return Request(ident, number, chosen, payloads.encode_payload(payload, chosen))


def decoded(response: Response) -> Any:
    """A reply's payload decoded by its encoding (``None`` when it has none); raw bytes if
    it does not decode."""
    if response.encoding == Encoding.NONE:
        return None
    try:
        return payloads.decode_payload(response.payload, response.encoding)
    except ValueError:
        return response.payload


def result_of(response: Response) -> Any:
    """The decoded payload of an Ok reply; :class:`STMPError` for any other status."""
    if response.status != Status.OK:
        raise STMPError(response.status, decoded(response))
    return decoded(response)


def timed_out(ident: int) -> Response:
    """The reply a client reports for a request that got none in time."""
    return Response(ident, Status.REQUEST_TIMEOUT)


def version_request(text: bool) -> tuple[Request, bool]:
    """The version check (id 0, action 0, raw list of :data:`VERSIONS`) and whether the
    text serialization must send it inline."""
    return Request(
        0, codec.ACTION_VERSION, Encoding.RAW, codec.encode_versions(list(VERSIONS), text)
    ), text


def accepted_version(response: Response, text: bool) -> tuple[int, int]:
    """The version the server chose, from its reply to the version check. ``STMPError``
    for a refusal (0x35 VersionNotSupported, or any other status); ``RemoteProtocolError``
    for an Ok without one of the versions offered. In text mode the list is hex, whether
    it came inline or in a binary frame; a binary list is accepted too."""
    if response.status != Status.OK:
        raise STMPError(response.status, decoded(response))
    versions: list[tuple[int, int]] = []
    if text:
        try:
            versions = codec.decode_versions(response.payload, text=True)
        except RemoteProtocolError:
            versions = codec.decode_versions(response.payload)
    else:
        versions = codec.decode_versions(response.payload)
    if len(versions) != 1 or versions[0] not in VERSIONS:
        raise RemoteProtocolError(f"the server chose a version not offered: {versions}")
    return versions[0]


class RequestIds:
    """Request ids: u16, 1 to 65535 then 1 again (0 is the version check's), never one
    that is ``busy`` (a pending request's, or a timed-out one still waiting out its late
    reply)."""

    def __init__(self) -> None:
        self._next = 1

    def take(self, busy: Container[int]) -> int:
        for _ in range(0xFFFF):
            ident = self._next
            self._next = ident % 0xFFFF + 1
            if ident not in busy:
                return ident
        raise STMPError(Status.TOO_MANY_REQUESTS, "all 65535 request ids are in use", local=True)


class LateReplies:
    """Ids of requests that timed out: their late replies are dropped, and the ids are not
    reused until that reply came or :data:`LATE_REPLY_WINDOW` passed."""

    def __init__(self, window: float = LATE_REPLY_WINDOW) -> None:
        self.window = window
        self._until: dict[int, float] = {}

    def add(self, ident: int, now: float) -> None:
        self._expire(now)
        self._until[ident] = now + self.window

    def claim(self, ident: int) -> bool:
        """True (and forgotten) if ``ident`` is a timed-out request's."""
        return self._until.pop(ident, None) is not None

    def __contains__(self, ident: object) -> bool:
        return ident in self._until

    def _expire(self, now: float) -> None:
        if self._until and min(self._until.values()) <= now:
            self._until = {k: t for k, t in self._until.items() if t > now}


def login_fields(identity: str, scheme: str, credential: bytes | str | None) -> dict[str, Any]:
    """The login payload; the credential travels as text (a secret is text), so bytes must
    be UTF-8."""
    fields: dict[str, Any] = {"id": identity, "scheme": scheme}
    if credential is not None:
        if isinstance(credential, bytes):
            try:
                credential = credential.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("the credential must be UTF-8 text") from None
        fields["credential"] = credential
    return fields


def logged_in_as(asked: str, result: Any) -> str:
    """The identity a login's Ok reply gives: ``{"id": ...}`` when the broker accepted the
    login under another one than ``asked`` (an auth plugin chose it), else ``asked``."""
    if isinstance(result, dict) and isinstance(result.get("id"), str) and result["id"]:
        return str(result["id"])
    return asked


def structured(encoding: int) -> int:
    if encoding not in payloads.STRUCTURED:
        raise ValueError(f"the broker actions need JSON or msgpack, not encoding {encoding}")
    return encoding


# -- wires ---------------------------------------------------------------------------------------


class BinaryWire:
    """STMP on a byte stream (TCP): the binary serialization with PS."""

    text = False

    def __init__(self, max_payload: int = codec.DEFAULT_MAX_PAYLOAD) -> None:
        self._decoder = codec.BinaryDecoder(max_payload)

    def encode(self, message: Message, inline: bool | None = None) -> list[Any]:
        return [codec.encode_binary(message)]

    def decode(self, data: bytes) -> Iterable[Message]:
        return self._decoder.feed(data)


class WebSocketWire:
    """STMP in WebSocket messages, ``(is_binary, payload)``: the text serialization (a
    binary payload as the text header plus one binary message) or, with
    ``binary_frames``, one binary-serialized message (without PS) per binary message."""

    def __init__(
        self, max_payload: int = codec.DEFAULT_MAX_PAYLOAD, binary_frames: bool = False
    ) -> None:
        #: True for the text serialization (the version list is hex)
        self.text = not binary_frames
        self._decoder = codec.TextDecoder(max_payload)

    def encode(self, message: Message, inline: bool | None = None) -> list[Any]:
        if not self.text:
            return [(True, codec.encode_binary(message, with_ps=False))]
        text, followup = codec.encode_text(message, inline)
        units: list[Any] = [(False, text.encode("utf-8"))]
        if followup is not None:
            units.append((True, followup))
        return units

    def decode(self, unit: tuple[bool, bytes]) -> Iterable[Message]:
        binary, payload = unit
        message: Message | None
        try:
            if binary:
                message = self._decoder.binary_frame(payload)
            else:
                message = self._decoder.text_frame(payload.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError included
            raise RemoteProtocolError(str(e)) from None
        return () if message is None else (message,)
