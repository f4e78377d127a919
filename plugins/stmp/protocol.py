"""STMP server side: the protocol logic (:class:`STMPConnection`), transport-agnostic.
The adapters are ``tcp.py`` (binary serialization) and ``websocket.py``; the delivery
encoders and serializers are in ``encoders.py``.
"""

from __future__ import annotations

import inspect
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from msgbroker.errors import RemoteProtocolError

from . import codec, payloads, runs
from .codec import Encoding, Notify, Request, Response, Status
from .encoders import Framing, delivery_encoder, register_serializer, serializer
from .payloads import decode_payload, encode_payload
from .router import Reply, Router, RouteRequest, STMPStatusError

log = Logger(namespace="msgbroker.stmp")
#: a response's fields after its header (binary): ID u16, STATUS u8
_ID_STATUS = struct.Struct(">HB")

LOGIN_ACTIONS = frozenset({codec.ACTION_VERSION, payloads.LOGIN})
SUPPORTED_VERSIONS = [codec.VERSION]

# the encoders lived here once; the adapters and tests may import them from either module
__all__ = ["STMPConnection", "delivery_encoder", "register_serializer", "serializer"]

# -- the protocol logic ---------------------------------------------------------------------


class STMPConnection:
    """One STMP connection's behaviour: version check, login gate, heartbeat, request
    routing with timeouts, and the built-in broker actions (through the router).

    A login request that is answered later (a refused login waits ``login-failure-delay``)
    *holds* the connection's input until it is answered: the reading transport is paused,
    and the adapter stops parsing (:attr:`holding`) and keeps what it has not parsed, so
    the requests pipelined after it take effect after it, in order, and one connection
    cannot try logins faster than one per delay. When the login is answered,
    :attr:`on_release` (the adapter) parses what it kept, and reading resumes.
    """

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
        #: a login is pending: what arrives now waits (see the class docstring)
        self.holding = False
        #: what arrived while holding that the adapter could not keep unparsed (the rest of
        #: a run of requests): handled first on release
        self._held: deque[tuple[Any, Framing | None, bool]] = deque()
        #: set by the adapter: called on a successful login (to lift the pre-login frame
        #: limit) and when a hold ends (to parse what it kept)
        self.on_login: Callable[[], None] | None = None
        self.on_release: Callable[[], None] | None = None
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
        if self.holding:
            self._held.append((message, framing, payload_frame))
            return
        self._handle(message, framing, payload_frame)

    def _handle(
        self, message: codec.Message | codec.RequestRun, framing: Framing | None, paired: bool
    ) -> None:
        self.current_framing = framing or self.framing
        kind = type(message)
        if kind is Request:
            self._request(message, framing, paired)  # type: ignore[arg-type]
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
            # a login answered later holds what follows it (requests take effect in order)
            self._wait(request, result, route.timeout, framing, hold=action == payloads.LOGIN)
        else:
            self._answer(request, result, framing)

    def _request_run(self, run: codec.RequestRun) -> None:
        """Pipelined requests of one action (binary TCP only): publishes take the fast
        path when they may, anything else is handled request by request."""
        if runs.takes(self, run):
            runs.publish_run(self, run)
            return
        for start, end in run.spans():
            if self.holding:  # a login in the run is pending: the rest waits for it
                self._held.append((run.request(start, end), None, False))
                continue
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

    def _wait(
        self,
        request: Request,
        d: defer.Deferred[Any],
        timeout: float,
        framing: Framing | None,
        hold: bool = False,
    ) -> None:
        """Answer ``request`` when ``d`` fires, or GatewayTimeout after ``timeout``; with
        ``hold``, nothing received after it is handled before that answer."""
        key = object()

        def timed_out() -> None:
            self._pending.pop(key, None)
            self.respond(request, Status.GATEWAY_TIMEOUT, framing=framing)
            d.cancel()
            if hold:
                self._release()

        timer = self.clock.callLater(timeout, timed_out)
        self._pending[key] = (d, timer)
        if hold:
            self._hold()

        def done(result: Any) -> None:
            if self._pending.pop(key, None) is None:
                return  # timed out already (or closed): the late result is dropped
            timer.cancel()
            self._answer(request, result, framing)
            if hold:
                self._release()

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
            if hold:
                self._release()
            return None

        d.addCallbacks(done, failed)

    # -- holding the input while a login is pending ------------------------------------------

    def _hold(self) -> None:
        self.holding = True
        # the peer's further bytes wait in its socket buffers, not in ours; counted, so
        # flood control holding the same peer is not undone by our release
        self.session.hold_reading("stmp.login")

    def _release(self) -> None:
        """The pending login was answered: handle what waited, in order, until it is all
        handled or another login holds the input again; then read again."""
        self.holding = False
        held = self._held
        while held and not self.holding and not self.closed:
            self._handle(*held.popleft())
        if self.holding or self.closed:
            return
        if self.on_release is not None:
            self.on_release()
        if self.holding or self.closed:
            return
        self.session.release_reading("stmp.login")

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
        if self.on_login is not None:
            self.on_login()

    # -- timers and closing --------------------------------------------------------------------

    def _beat(self) -> None:
        """Ping every interval; close once two intervals pass without a byte from the
        client (checked when that deadline falls, not only at the next ping)."""
        now = self.clock.seconds()
        if self.session.reading_held:
            self._last_rx = now  # the broker stopped reading: the silence is ours
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
        """The transport is gone: stop every timer, drop pending handlers (a cancelled
        handler's errback finds nothing pending, so nothing is answered)."""
        self.closed = True
        self._held.clear()
        for call in (self._heartbeat, self._login_timer):
            if call is not None and call.active():
                call.cancel()
        pending, self._pending = self._pending, {}
        for d, timer in pending.values():
            if timer.active():
                timer.cancel()
            d.cancel()
