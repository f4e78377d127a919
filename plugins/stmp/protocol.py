"""STMP server side: the protocol logic (:class:`STMPConnection`, transport-agnostic), the
TCP adapter (binary serialization), and the delivery encoders.

A delivery (a message routed by the hub) reaches an STMP client as a notify, action
``0.0.1.16``, payload ``{"from", "kind", "topic"?, "data" | "data_b64"}`` in the
encoding the client logged in with (JSON or msgpack). Encoders produce the complete wire
bytes (for WebSocket: the frames themselves), one function per (framing, encoding), so the
hub encodes once per group of recipients that share them.
"""

from __future__ import annotations

import inspect
import struct
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from msgbroker.connection import BrokerProtocol
from msgbroker.errors import RemoteProtocolError
from msgbroker.message import Kind, Message

from . import codec, payloads, runs
from .codec import Encoding, Notify, Request, Response, Status
from .payloads import decode_payload, encode_payload
from .router import Reply, Router, RouteRequest, STMPStatusError

log = Logger(namespace="msgbroker.stmp")
#: a response's fields after its header (binary): ID u16, STATUS u8
_ID_STATUS = struct.Struct(">HB")

LOGIN_ACTIONS = frozenset({codec.ACTION_VERSION, payloads.LOGIN})
SUPPORTED_VERSIONS = [codec.VERSION]

#: how a connection frames what it sends: "binary" (TCP, with PS), or over WebSocket
#: "text" (text frames, binary payloads in a second frame) or "frame" (binary frames)
Framing = str
#: message (and ``inline``: a text payload in the text frame, see codec.encode_text) -> wire
Serializer = Callable[[codec.Message, "bool | None"], bytes]


# -- delivery encoders ----------------------------------------------------------------------

_DELIVERY_KINDS = {
    Kind.MCAST: "mcast",
    Kind.UCAST: "ucast",
    Kind.BCAST: "bcast",
    Kind.SUBSCRIBE: "subscribe",
    Kind.UNSUBSCRIBE: "unsubscribe",
}
_encoders: dict[tuple[Framing, int], Callable[[Message], bytes | None]] = {}


def _delivery(message: Message, encoding: int) -> dict[str, Any]:
    kind = message.kind
    topic = message.topic if kind in (Kind.MCAST, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE) else None
    data = message.payload if kind in (Kind.MCAST, Kind.UCAST, Kind.BCAST) else None
    return payloads.delivery_fields(message.sender, _DELIVERY_KINDS[kind], topic, data, encoding)


def delivery_encoder(framing: Framing, encoding: int) -> Callable[[Message], bytes | None]:
    """The (shared) encoder of deliveries for one framing and payload encoding."""
    key = (framing, encoding)
    encoder = _encoders.get(key)
    if encoder is None:
        serialize = serializer(framing)
        template = runs.mcast_template(framing, encoding)

        def encode(message: Message) -> bytes | None:
            try:
                if template is not None and message.kind is Kind.MCAST:
                    frame = template(message)
                    if frame is not None:
                        return frame
                payload = encode_payload(_delivery(message, encoding), encoding)
            except ValueError:
                # a topic or sender JSON/msgpack cannot carry as text (an sbus key that is
                # not UTF-8 maps to lone surrogates): this recipient is skipped
                return None
            return serialize(Notify(payloads.DELIVERY, encoding, payload), None)

        encode.__qualname__ = f"stmp_{framing}_{Encoding(encoding).name.lower()}_delivery"
        encode_run = runs.run_encoder(framing, encoding, encode)
        if encode_run is not None:
            encode.encode_run = encode_run  # type: ignore[attr-defined]
        encoder = _encoders[key] = encode
    return encoder


def _binary(message: codec.Message, inline: bool | None = None) -> bytes:
    return codec.encode_binary(message)


_serializers: dict[Framing, Serializer] = {"binary": _binary}


def serializer(framing: Framing) -> Serializer:
    return _serializers[framing]


def register_serializer(framing: Framing, function: Serializer) -> None:
    """The WebSocket adapter registers its framings ("text", "frame") here."""
    _serializers[framing] = function


# -- the protocol logic ---------------------------------------------------------------------


class STMPConnection:
    """One STMP connection's behaviour: version check, login gate, heartbeat, request
    routing with timeouts, and the built-in broker actions (through the router)."""

    def __init__(
        self,
        broker: Any,
        router: Router,
        session: Any,
        framing: Framing,
        peer_names: Callable[[], frozenset[str] | None] = lambda: None,
    ) -> None:
        self.broker = broker
        self.router = router
        self.session = session
        self.clock = broker.reactor
        self.framing = framing
        self._serialize = serializer(framing)
        #: names the client's verified TLS certificate proves (asked at login)
        self.peer_names = peer_names
        #: how the message being handled arrived (WebSocket: "text" or "frame")
        self.current_framing: Framing = framing
        self.closed = False
        self.version: tuple[int, int] | None = None
        self.encoding = Encoding.JSON
        self._pending: dict[object, Any] = {}
        interval = broker.config.keepalive
        self._interval = interval
        self._last_rx = self.clock.seconds()
        self._next_ping = self._last_rx + interval
        self._heartbeat = self.clock.callLater(interval, self._beat)
        self._login_timer = self.clock.callLater(broker.config.login_timeout, self._login_late)
        session.encode = delivery_encoder(framing, Encoding.JSON)
        session.data["stmp"] = self

    # -- output --------------------------------------------------------------------------------

    def send(
        self, message: codec.Message, framing: Framing | None = None, inline: bool | None = None
    ) -> None:
        serialize = self._serialize if framing is None else serializer(framing)
        if type(message) is Response:
            self.session.reply(serialize(message, inline))  # never dropped
        else:
            self.session.send(serialize(message, inline))

    def respond(self, request: Request, status: int, payload: Any = None, framing=None) -> None:
        if payload is None:
            if (framing or self.framing) == "binary":  # the common answer, made directly
                self.session.reply(b"\xc0" + _ID_STATUS.pack(request.id, status))
            else:
                self.send(Response(request.id, status), framing)
            return
        encoding = request.encoding if request.encoding != Encoding.NONE else Encoding.JSON
        try:
            data = encode_payload(payload, encoding)
        except (TypeError, ValueError):
            log.failure(
                "STMP handler for {action} returned an unencodable payload",
                action=codec.action_to_str(request.action),
            )
            self.send(Response(request.id, Status.INTERNAL_SERVER_ERROR), framing)
            return
        self.send(Response(request.id, status, encoding, data), framing)

    # -- input ---------------------------------------------------------------------------------

    def received(
        self,
        message: codec.Message | codec.RequestRun,
        framing: Framing | None = None,
        payload_frame: bool = False,
    ) -> None:
        """Handle one message from the client (``framing``: how to answer it;
        ``payload_frame``: a text-mode message whose payload came in its own binary frame)."""
        if self.closed:
            return
        self._last_rx = self.clock.seconds()
        self.current_framing = framing or self.framing
        kind = type(message)
        if kind is Request:
            self._request(message, framing, payload_frame)  # type: ignore[arg-type]
        elif kind is codec.RequestRun:
            self._request_run(message)  # type: ignore[arg-type]
        elif kind is Notify:
            self._notify(message)  # type: ignore[arg-type]
        # Ping: activity only. Response: we send no requests, so there is nothing to match.

    def _request(
        self, request: Request, framing: Framing | None, payload_frame: bool = False
    ) -> None:
        action = request.action
        if action == codec.ACTION_VERSION:
            self._version_check(request, framing, payload_frame)
            return
        if action >> 8 == 0:  # the protocol's own range: nothing else is defined there
            self.respond(request, Status.NOT_FOUND, framing=framing)
            return
        if self.session.identity is None and action not in LOGIN_ACTIONS:
            self.respond(request, Status.UNAUTHORIZED, framing=framing)
            return
        route = self.router.lookup(action)
        if route is None:
            self.respond(request, Status.NOT_FOUND, framing=framing)
            return
        try:
            payload = decode_payload(request.payload, request.encoding)
        except ValueError:
            self.respond(request, Status.BAD_REQUEST, framing=framing)
            return
        route_request = RouteRequest(
            self.session, self.broker, action, request.encoding, payload, request.payload
        )
        try:
            result = route.handler(route_request)
        except STMPStatusError as e:
            self.respond(request, e.status, e.payload, framing)
            return
        except Exception:
            log.failure("STMP handler for {action} failed", action=codec.action_to_str(action))
            self.respond(request, Status.INTERNAL_SERVER_ERROR, framing=framing)
            return
        if inspect.iscoroutine(result):
            result = defer.ensureDeferred(result)
        if isinstance(result, defer.Deferred):
            self._wait(request, result, route.timeout, framing)
        else:
            self._answer(request, result, framing)

    def _request_run(self, run: codec.RequestRun) -> None:
        """Pipelined requests of one action (binary TCP only): publishes take the fast
        path when they may, anything else is handled request by request."""
        if runs.takes(self, run):
            runs.publish_run(self, run)
            return
        for start, end in run.spans():
            self._request(run.request(start, end), None)
            if self.closed:
                return

    def _answer(self, request: Request, result: Any, framing: Framing | None) -> None:
        if self.closed:
            return
        if isinstance(result, Reply):
            self.respond(request, result.status, result.payload, framing)
            if result.after is not None:
                result.after()
        else:
            self.respond(request, Status.OK, result, framing)

    def _wait(self, request: Request, d: defer.Deferred[Any], timeout: float, framing) -> None:
        key = object()

        def timed_out() -> None:
            self._pending.pop(key, None)
            self.respond(request, Status.GATEWAY_TIMEOUT, framing=framing)
            d.cancel()

        timer = self.clock.callLater(timeout, timed_out)
        self._pending[key] = (d, timer)

        def done(result: Any) -> None:
            if self._pending.pop(key, None) is None:
                return  # timed out already (or closed): the late result is dropped
            timer.cancel()
            self._answer(request, result, framing)

        def failed(failure: Any) -> None:
            if self._pending.pop(key, None) is None:
                return None
            timer.cancel()
            error = failure.value
            if isinstance(error, STMPStatusError):
                self.respond(request, error.status, error.payload, framing)
            else:
                log.failure(
                    "STMP handler for {action} failed",
                    failure,
                    action=codec.action_to_str(request.action),
                )
                self.respond(request, Status.INTERNAL_SERVER_ERROR, framing=framing)
            return None

        d.addCallbacks(done, failed)

    def _notify(self, notify: Notify) -> None:
        """A notify from the client: its route's handler runs, and nothing is answered.
        What the client got wrong (bad payload, a refusal) is dropped quietly; a handler
        that fails for any other reason is logged, since that is the plugin's bug."""
        if self.session.identity is None or notify.action >> 8 == 0:
            return
        route = self.router.lookup(notify.action)
        if route is None:
            return
        try:
            payload = decode_payload(notify.payload, notify.encoding)
        except ValueError:
            return
        request = RouteRequest(
            self.session,
            self.broker,
            notify.action,
            notify.encoding,
            payload,
            notify.payload,
            notify=True,
        )
        try:
            result = route.handler(request)
        except STMPStatusError:
            return
        except Exception:
            log.failure("STMP notify handler for {action} failed", action=request.action_text)
            return
        if inspect.iscoroutine(result):
            result = defer.ensureDeferred(result)
        if isinstance(result, defer.Deferred):
            result.addErrback(self._notify_failed, request.action_text)

    @staticmethod
    def _notify_failed(failure: Any, action: str) -> None:
        if not failure.check(STMPStatusError, defer.CancelledError):
            log.failure("STMP notify handler for {action} failed", failure, action=action)

    def _version_check(
        self, request: Request, framing: Framing | None, payload_frame: bool = False
    ) -> None:
        """In text mode the version list is hex digits (DECISIONS.md). In the binary frame
        after a text header, a list that is not hex is taken as raw bytes, as any binary
        payload of that frame would be (**our decision**: a client following the two-frame
        rule for encoding raw is understood); the answer is then raw in a binary frame too.
        Elsewhere (TCP, a WebSocket binary message) the list is raw bytes."""
        text = (framing or self.framing) == "text"
        try:
            offered = codec.decode_versions(request.payload, text=text)
        except RemoteProtocolError:
            offered = []
            if text and payload_frame:
                text = False
                offered = codec.decode_versions(request.payload)
        chosen = max((v for v in offered if v in SUPPORTED_VERSIONS), default=None)
        if request.id != 0 or chosen is None:
            self.send(Response(request.id, Status.VERSION_NOT_SUPPORTED), framing)
            self.close("version not supported")
            return
        self.version = chosen
        payload = codec.encode_versions([chosen], text=text)
        # text mode carries the version list as hex inside the text frame
        self.send(Response(0, Status.OK, Encoding.RAW, payload), framing, inline=text)

    # -- login (called by the built-in login action) -------------------------------------------

    def logged_in(self, encoding: int, framing: Framing | None) -> None:
        """Deliveries from now on use ``encoding`` (JSON or msgpack) and ``framing``."""
        if encoding in (Encoding.JSON, Encoding.MSGPACK):
            self.encoding = Encoding(encoding)
        # what the server sends unasked (deliveries, pings) follows the login's framing
        self.framing = framing or self.framing
        self._serialize = serializer(self.framing)
        self.session.encode = delivery_encoder(self.framing, self.encoding)
        if self._login_timer.active():
            self._login_timer.cancel()

    # -- timers and closing --------------------------------------------------------------------

    def _beat(self) -> None:
        """Ping every interval; close once two intervals pass without a byte from the
        client (checked when that deadline falls, not only at the next ping)."""
        now = self.clock.seconds()
        deadline = self._last_rx + 2 * self._interval
        if now >= deadline:
            self._heartbeat = None
            self.close("keepalive timeout")
            return
        if now >= self._next_ping:
            self.send(codec.PING)
            self._next_ping = now + self._interval
        self._heartbeat = self.clock.callLater(min(self._next_ping, deadline) - now, self._beat)

    def _login_late(self) -> None:
        if self.session.identity is None:
            self.close("login timeout")

    def close(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.session.close(reason)

    def lost(self) -> None:
        """The transport is gone: stop every timer, drop pending handlers."""
        self.closed = True
        for call in (self._heartbeat, self._login_timer):
            if call is not None and call.active():
                call.cancel()
        for d, timer in self._pending.values():
            if timer.active():
                timer.cancel()
            d.cancel()
        self._pending.clear()


class STMPServerProtocol(BrokerProtocol):
    """STMP over TCP: binary serialization with PS."""

    name = "stmp"
    encode = staticmethod(delivery_encoder("binary", Encoding.JSON))
    stmp: STMPConnection | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        # the STMP connection runs its own login timer and heartbeat
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None
        factory: Any = self.factory
        self._decoder = codec.BinaryDecoder(factory.max_payload)
        self.stmp = STMPConnection(
            self.broker,
            factory.router,
            self.session,
            "binary",
            self.peer_certificate_names,
        )

    def dataReceived(self, data: bytes) -> None:
        stmp = self.stmp
        if stmp is None or stmp.closed:
            return
        try:
            for message in self._decoder.feed_runs(data):
                stmp.received(message)
                if stmp.closed:
                    break
        except RemoteProtocolError as e:
            log.debug("stmp {host}: protocol error: {why}", host=self.session.host, why=str(e))
            stmp.close(f"protocol error: {e}")
        self.broker.batcher.flush()  # what this chunk caused: one write per recipient

    def connectionLost(self, reason: Any = None) -> None:
        if self.stmp is not None:
            self.stmp.lost()
        super().connectionLost(reason)
