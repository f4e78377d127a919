"""The STMP server session, sans-IO: bytes in; hub calls, replies and timer requests out.
:class:`STMPServerSession` reads the binary serialization on a byte stream (TCP, TLS,
unix); its WebSocket variant, one WebSocket message at a time, is
``websocket_session.py``'s. The framework's ``Connection`` runs both; ``websocket.py`` is
the autobahn glue, ``encoders.py`` has the delivery encoders and each framing's serializer.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from twisted.logger import Logger

from msgbroker.connection import ServerSession
from msgbroker.errors import RemoteProtocolError
from msgbroker.reasons import CloseReason
from msgbroker.timers import Timer

from . import codec, payloads, runs
from .codec import Encoding, Notify, Request, Response, Status
from .encoders import Framing, delivery_encoder, serializer
from .payloads import decode_payload, encode_payload
from .router import Reply, RouteRequest, STMPStatusError, router_for, run_handler

log = Logger(namespace="msgbroker.stmp")
#: a response's fields after its header (binary): ID u16, STATUS u8
_ID_STATUS = struct.Struct(">HB")

LOGIN_ACTIONS = frozenset({codec.ACTION_VERSION, payloads.LOGIN})
SUPPORTED_VERSIONS = [codec.VERSION]
#: what holds the peer's input while a login is pending (``Session.hold_reading``)
_LOGIN_HOLD = "stmp.login"


class STMPServerSession(ServerSession):
    """One STMP connection on the server side: version check, login gate, heartbeat,
    request routing with timeouts, and the built-in broker actions (through the router).

    A login answered later (a refused one waits ``login-failure-delay``) *holds* the input
    until it is answered: reading stops (``hold_reading``) and what arrived waits unparsed,
    so what was pipelined after the login takes effect after it, in order, and one
    connection cannot try logins faster than one per delay. Before login a message may be
    at most ``prelogin-max-frame`` bytes, refused as soon as its PS is read, so an
    unauthenticated peer never makes the broker buffer more than that.

    ``peer.data["stmp"]`` is this session: a route handler writes to its own client with
    :meth:`send`.
    """

    name = "stmp"
    # (a Callable, not a def: mypy misses the base's parameter name)
    encode = staticmethod(delivery_encoder("binary", Encoding.JSON))  # type: ignore[assignment]
    #: how what the broker sends unasked is framed until the login chooses
    framing: Framing = "binary"
    max_payload = codec.DEFAULT_MAX_PAYLOAD
    #: the byte stream's decoder (None over WebSocket)
    _decoder: codec.BinaryDecoder | None = None

    def opened(self) -> None:
        self.prepare()
        self._decoder = codec.BinaryDecoder(self.max_payload, self.broker.config.prelogin_max_frame)
        #: bytes that arrived while the input was held (TLS may hand over more than one
        #: chunk per socket read), parsed on release
        self._kept: list[bytes] = []
        self.start_heartbeat()

    def prepare(self) -> None:
        """The state of a new connection (before its first message)."""
        self.router = router_for(self.broker)
        self._serialize = serializer(self.framing)
        #: how the message being handled arrived (WebSocket: "text" or "frame")
        self.current_framing: Framing = self.framing
        self.version: tuple[int, int] | None = None  # what the version check chose
        self.encoding = Encoding.JSON
        #: route handlers answering later: key -> (Deferred, its route timeout)
        self._pending: dict[object, tuple[Any, Timer]] = {}
        #: a login is pending: what arrives now waits (see the class docstring)
        self.holding = False
        #: decoded messages that arrived while holding (the rest of a run): first on release;
        #: made when a login first holds the input (an empty deque is 760 B per connection)
        self._held: deque[tuple[Any, Framing | None, bool]] | None = None
        self._last_rx = self.timers.seconds()
        self.peer.data["stmp"] = self

    # -- input: a byte stream ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_rx = self.timers.seconds()
        if self.holding:
            self._kept.append(data)
            return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        # Runs of pipelined requests are only worth it (and only taken) after login; before
        # it, one message at a time, so a held input stops right after the login that holds
        # it and what follows stays unparsed in the decoder.
        decoder: Any = self._decoder
        logged_in = self.peer.identity is not None
        messages = decoder.feed_runs(data) if logged_in else decoder.feed(data)
        try:
            for message in messages:
                self.received(message)
                if self.closed or self.holding:
                    break
        except RemoteProtocolError as e:
            self._protocol_error(str(e))
        finally:
            messages.close()  # keeps the bytes after the last message handled

    def _protocol_error(self, why: str) -> None:
        log.debug("stmp {host}: protocol error: {why}", host=self.peer.host, why=why)
        self.close(CloseReason.PROTOCOL_ERROR, why)

    # -- output --------------------------------------------------------------------------------

    def send(
        self, message: codec.Message, framing: Framing | None = None, inline: bool | None = None
    ) -> None:
        """Write one message in this connection's framing (or ``framing``): a response as
        an answer (never dropped), anything else as a delivery."""
        serialize = self._serialize if framing is None else serializer(framing)
        if type(message) is Response:
            self.reply(serialize(message, inline))
        else:
            self.peer.send(serialize(message, inline))

    def respond(
        self, request: Request, status: int, payload: Any = None, framing: Framing | None = None
    ) -> None:
        if payload is None:
            if (framing or self.framing) == "binary":  # the common answer, made directly
                self.reply(b"\xc0" + _ID_STATUS.pack(request.id, status))
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

    # -- messages ------------------------------------------------------------------------------

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
        if self.holding:
            assert self._held is not None  # made by _hold
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
        if self.peer.identity is None and action not in LOGIN_ACTIONS:
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
            self.peer, self.broker, action, request.encoding, payload, request.payload
        )
        try:
            result = run_handler(route, route_request)
        except STMPStatusError as e:
            if action == payloads.LOGIN and e.status == Status.UNAUTHORIZED:
                self._refuse_login(request, e, framing)
            else:
                self.respond(request, e.status, e.payload, framing)
            return
        except Exception:
            log.failure("STMP handler for {action} failed", action=codec.action_to_str(action))
            self.respond(request, Status.INTERNAL_SERVER_ERROR, framing=framing)
            return
        if hasattr(result, "addCallbacks"):  # a Deferred: the handler answers later
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
                assert self._held is not None  # made by _hold
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
        self, request: Request, d: Any, timeout: float, framing: Framing | None, hold: bool
    ) -> None:
        """Answer ``request`` when the Deferred ``d`` fires, or GatewayTimeout after
        ``timeout``; with ``hold``, nothing received after it is handled before that."""
        key = object()

        def timed_out() -> None:
            self._pending.pop(key, None)
            self.respond(request, Status.GATEWAY_TIMEOUT, framing=framing)
            d.cancel()
            if hold:
                self._release()

        timer = self.timers.call_later(timeout, timed_out)
        self._pending[key] = (d, timer)
        if hold:
            self._hold()

        def due() -> bool:
            """False once timed out (or closed): a late result is dropped."""
            if self._pending.pop(key, None) is None:
                return False
            timer.cancel()
            return True

        def done(result: Any) -> None:
            if due():
                self._answer(request, result, framing)
                if hold:
                    self._release()

        def failed(failure: Any) -> None:
            if not due():
                return None
            error = failure.value
            if isinstance(error, STMPStatusError) and _refused_login(request, error):
                self._refuse_login(request, error, framing)  # late too; releases then
                if self.broker.config.login_failure_delay > 0:
                    return None
            elif isinstance(error, STMPStatusError):
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

    def _notify(self, notify: Notify) -> None:
        """Its route's handler runs, nothing is answered. What the client got wrong (bad
        payload, a refusal) is dropped quietly; any other failure is the plugin's: logged."""
        if self.peer.identity is None or notify.action >> 8 == 0:
            return
        route = self.router.lookup(notify.action)
        if route is None:
            return
        try:
            payload = decode_payload(notify.payload, notify.encoding)
        except ValueError:
            return
        action, encoding = notify.action, notify.encoding
        request = RouteRequest(
            self.peer, self.broker, action, encoding, payload, notify.payload, True
        )
        try:
            result = run_handler(route, request)
        except STMPStatusError:
            return
        except Exception:
            log.failure("STMP notify handler for {action} failed", action=request.action_text)
            return
        if hasattr(result, "addCallbacks"):
            result.addErrback(_notify_failed, request.action_text)

    def _version_check(
        self, request: Request, framing: Framing | None, payload_frame: bool = False
    ) -> None:
        """The list is raw bytes, but hex digits in text mode; in the binary frame after a
        text header, a list that is not hex is raw bytes (**our decision**: the two-frame
        rule sends raw as bytes), and so is the answer then."""
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
            self.close(CloseReason.VERSION_NOT_SUPPORTED)
            return
        self.version = chosen
        payload = codec.encode_versions([chosen], text=text)
        # text mode carries the version list as hex inside the text frame
        self.send(Response(0, Status.OK, Encoding.RAW, payload), framing, inline=text)

    # -- login ---------------------------------------------------------------------------------

    def login_accepted(self, encoding: int) -> None:
        """Called by the login action: deliveries from now on use ``encoding`` (JSON or
        msgpack) and the framing of the login request."""
        if encoding in (Encoding.JSON, Encoding.MSGPACK):
            self.encoding = Encoding(encoding)
        # what the server sends unasked (deliveries, pings) follows the login's framing
        self.framing = self.current_framing
        self._serialize = serializer(self.framing)
        self.peer.encode = delivery_encoder(self.framing, self.encoding)
        self.logged_in()  # the login timer stops
        if self._decoder is not None:
            self._decoder.max_message = None  # the pre-login bound on a message is lifted

    def _refuse_login(
        self, request: Request, refused: STMPStatusError, framing: Framing | None
    ) -> None:
        """A refused login is answered ``login-failure-delay`` late, and nothing after it
        is handled meanwhile, so guessing is slow."""
        delay = self.broker.config.login_failure_delay
        if delay <= 0:
            self.respond(request, refused.status, refused.payload, framing)
            return

        def answer() -> None:
            self._answer(request, Reply(refused.status, refused.payload), framing)
            self._release()

        self._hold()
        self.timers.call_later(delay, answer)

    def _hold(self) -> None:
        self.holding = True
        if self._held is None:
            self._held = deque()
        # the peer's bytes wait in its socket buffers, not ours; counted, so our release
        # does not undo flood control holding the same peer
        self.peer.hold_reading(_LOGIN_HOLD)

    def _release(self) -> None:
        """The pending login was answered: handle what waited, in order, until it is all
        handled or another login holds the input again; then read again."""
        self.holding = False
        held = self._held
        while held and not self.holding and not self.closed:
            self._handle(*held.popleft())
        if self.holding or self.closed:
            return
        self.release_kept()
        if self.holding or self.closed:
            return
        self.peer.release_reading(_LOGIN_HOLD)

    def release_kept(self) -> None:
        """Parse what waited while the input was held: the rest of the decoder's buffer and
        what arrived meanwhile (over WebSocket, autobahn's buffer waits instead)."""
        kept, self._kept = b"".join(self._kept), []
        self._parse(kept)

    # -- heartbeat and closing -----------------------------------------------------------------

    def start_keepalive(self) -> None:
        """Nothing at login: STMP's heartbeat runs from the open (:meth:`start_heartbeat`)."""

    def start_heartbeat(self) -> None:
        """Ping every ``--keepalive`` seconds, whatever the traffic; close once two
        intervals pass without a byte from the client."""
        self._interval = interval = self.broker.config.keepalive
        now = self.timers.seconds()
        self._last_rx = now
        self._next_ping = now + interval
        self.timers.call_later(interval, self._beat)

    def _beat(self) -> None:
        """Checked when the silence deadline falls, not only at the next ping."""
        now = self.timers.seconds()
        if self.peer.reading_held:
            self._last_rx = now  # the broker stopped reading: the silence is ours
        deadline = self._last_rx + 2 * self._interval
        if now >= deadline:
            self.close(CloseReason.KEEPALIVE_TIMEOUT)
            return
        if now >= self._next_ping:
            self.send(codec.PING)
            self._next_ping = now + self._interval
        self.timers.call_later(min(self._next_ping, deadline) - now, self._beat)

    def lost(self) -> None:
        """Gone (timers cancelled already): pending handlers are cancelled, unanswered."""
        self._held = None
        pending, self._pending = self._pending, {}
        for d, _timer in pending.values():
            d.cancel()


def _notify_failed(failure: Any, action: str) -> None:
    # (Failure.check takes a class's name too: no Twisted import for CancelledError)
    if not failure.check(STMPStatusError, "twisted.internet.defer.CancelledError"):
        log.failure("STMP notify handler for {action} failed", failure, action=action)


def _refused_login(request: Request, error: STMPStatusError) -> bool:
    return request.action == payloads.LOGIN and error.status == Status.UNAUTHORIZED
