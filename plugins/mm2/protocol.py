"""The Micromessage2 server session: the handshake, login, frames, routing and extensions.

Sans-IO (:class:`msgbroker.connection.ServerSession`): the framework's connection adapter
feeds it bytes, runs its timers and writes what it sends through its output, the
acknowledgement window (:class:`.window.WindowOutput`, chosen in :meth:`make_output`).

A connection goes through the three-step handshake (the client's hello, our reply, the
client's confirmation; docs/mm2.md), logs its identity in, activates the confirmed
extensions (:mod:`.extensions`) and configures its window with what they asked for, then
reads frames: MESSAGEs are routed through the hub (destination ``@identity``: a unicast),
COMMANDs go to the extension that claims their name, EXTENSION frames to their extension
by id. Anything the client gets wrong is an ERROR frame, then the connection closes.

Before login a connection holds little: a handshake step (or an ERROR frame sent instead)
longer than ``prelogin-max-frame`` is refused as soon as its lengths show it. A refused
login is answered ``login-failure-delay`` late. Micromessage2 has no heartbeat
(``heartbeat = False``): no idle timer runs, and the framework has the kernel probe a silent
peer with TCP keepalive (:mod:`msgbroker.tcpkeepalive`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger

from msgbroker.auth import Accept, AuthResult, LoginRequest
from msgbroker.connection import ServerSession
from msgbroker.errors import NoSuchIdentity, NotAuthorized, RemoteProtocolError
from msgbroker.message import Kind, Message, MessageRun
from msgbroker.reasons import CloseReason
from msgbroker.timers import Timer

from . import codec
from .delivery import encode_delivery
from .extensions import ExtensionContext, ExtensionHandler, Registry, registry_for
from .handshake import LOGIN_EXTENSION
from .window import WindowOutput

if TYPE_CHECKING:
    from msgbroker.broker import Broker
    from msgbroker.session import Session

log = Logger(namespace="msgbroker.mm2")
#: holds the peer's input while its login is checked (Session.hold_reading)
_LOGIN_HOLD = "mm2.login"

#: the identity our handshake reply gives
SERVER_IDENTITY = "msgbroker"


class MM2ServerSession(ServerSession):
    """One Micromessage2 connection on the server side."""

    name = "mm2"
    encode = staticmethod(encode_delivery)
    #: no ping in the protocol: the kernel probes a silent peer (docs/mm2.md)
    heartbeat = False

    output: WindowOutput

    @classmethod
    def make_output(cls, broker: Broker, session: Session, transport: Any) -> WindowOutput:
        """The acknowledgement window, over the framework's batched transport output."""
        out = super().make_output(broker, session, transport)
        return WindowOutput(session, out, broker.policy, broker.output_budget)

    def opened(self) -> None:
        broker = self.broker
        self.output = self.peer.output  # type: ignore[assignment]  # make_output's
        self.registry: Registry = registry_for(broker)
        self._prelogin_max = broker.config.prelogin_max_frame
        self._handshake: codec.HandshakeDecoder | None = codec.HandshakeDecoder(self._prelogin_max)
        #: the delayed answer to a refused login (nothing more is read meanwhile)
        self._refusal: Timer | None = None
        #: while the login is checked: the confirmation's extensions, and what came after
        self._login_pending = False
        self._active = codec.ActiveExtensions()
        self._after_login = b""
        self._hello: codec.Handshake | None = None
        self._reply: codec.Handshake | None = None
        self._frames = codec.FrameDecoder(codec.DEFAULT_MAX_PAYLOAD)
        self._reassembler = codec.Reassembler(codec.DEFAULT_MAX_MESSAGE)
        self.minor = codec.MINOR
        self.active = codec.ActiveExtensions()
        self.handlers: dict[int, ExtensionHandler] = {}
        self._commands: dict[str, ExtensionHandler] = {}
        self._incoming: list[ExtensionHandler] = []
        #: the last sequence number received (0: none yet)
        self.seq_in = 0
        # set by the extensions as the handshake activates them (.builtin):
        #: ack/batch-ack: at most this many of our messages unacknowledged (the window's size)
        self.window: int | None = None
        #: ack/batch-ack: sends one cumulative ack for the client's messages, once per input
        self.acker: Any = None
        #: dotnet: its extension id, and the type the client's next messages carry
        self.dotnet_id: int | None = None
        self.encoding_hint: str | None = None

    # -- input --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.closed:
            return
        if self._login_pending:  # read once the login is decided (if accepted)
            self._after_login += data
            return
        try:
            if self._handshake is not None:
                data = self._handshake_data(data)
            if self._handshake is None and data and self._refusal is None:
                for frame in self._frames.feed_runs(data):
                    if type(frame) is codec.MessageBatch:
                        self._batch(frame)
                    else:
                        self._frame(frame)  # type: ignore[arg-type]
                    if self.closed:
                        return
            if self.acker is not None and not self.closed:
                self.acker()
        except RemoteProtocolError as e:
            self.protocol_error(str(e), refusal_reason(e))

    def _handshake_data(self, data: bytes) -> bytes:
        """Feed the handshake; the bytes after it (frames) are returned once it is done."""
        decoder = self._handshake
        assert decoder is not None
        step = decoder.feed(data)
        if step is None:
            return b""
        if isinstance(step, codec.ErrorFrame):
            self._refused_by_peer(step.text)
            return b""
        if self._hello is None:
            self._hello = step
            self._answer_hello(step)
            if self.closed:  # our reply was more than a peer that does not read may hold
                return b""
            self._handshake = codec.HandshakeDecoder(self._prelogin_max)
            rest = decoder.trailing_data
            return self._handshake_data(rest) if rest else b""
        if not self._confirmed(step):
            # the login is being checked (what follows waits for it), or was refused
            # (what follows is never read)
            self._after_login = decoder.trailing_data
            return b""
        return decoder.trailing_data

    def _answer_hello(self, hello: codec.Handshake) -> None:
        self.minor = codec.negotiate_minor(hello)  # major 1 only
        if not hello.identity:
            raise RemoteProtocolError("an identity is required")
        registry = self.registry
        codec.check_required(hello.required, registry.names)
        # "I suggest Y like you but also Z" (the spec): the client's optional extensions we
        # support, as the client wrote them (its batch-ack window), then our own suggestions
        required = registry.required()
        taken = {ext.name for ext in required}
        optional = []
        for ext in (*hello.optional, *registry.offered()):
            if ext.name in registry.names and ext.name not in taken:
                taken.add(ext.name)
                optional.append(ext)
        reply = codec.Handshake(SERVER_IDENTITY, required, tuple(optional), minor=codec.MINOR)
        self._reply = reply
        self.reply(codec.encode_handshake(reply))

    def _confirmed(self, confirm: codec.Handshake) -> bool:
        """Step 3: check it and log in; True when the login is accepted at once, False
        while it is checked (the scheme answers later) or when it was refused."""
        assert self._hello is not None
        assert self._reply is not None
        active = codec.check_confirm(self._hello, self._reply, confirm, self.registry.names)
        names = self.certificate_names()
        scheme, credential = self._scheme(active, names)
        request = LoginRequest("mm2", confirm.identity, scheme, credential, self.peer.host, names)
        self._active = active
        self._login_pending = True
        self.broker.begin_login(self.peer, request, self._login_decided)
        if self._login_pending:
            self.peer.hold_reading(_LOGIN_HOLD)
            return False
        return self._handshake is None

    def _scheme(
        self, active: codec.ActiveExtensions, names: frozenset[str] | None
    ) -> tuple[str, bytes | None]:
        """The login scheme and credential: those of ``x-login`` when the confirmation
        lists it, else ``cert`` for a verified client certificate (when enabled), else
        ``open``."""
        login = active.by_name(LOGIN_EXTENSION)
        if login is not None:
            scheme = login.get("scheme")
            if not scheme:
                raise RemoteProtocolError(f"{LOGIN_EXTENSION} without a scheme")
            credential = login.get("credential")
            return scheme, None if credential is None else credential.encode("utf-8")
        enabled = self.broker.enabled_schemes
        return ("cert" if names is not None and "cert" in enabled else "open"), None

    def _login_decided(self, result: AuthResult) -> None:
        self._login_pending = False
        if not isinstance(result, Accept):
            self._refuse_login()
            return
        self.logged_in()
        try:
            self._activate(self._active)
        except RemoteProtocolError as e:
            self.protocol_error(str(e))
            return
        self._handshake = None
        after, self._after_login = self._after_login, b""
        if after:  # answered later: what came meanwhile is read now, in order
            self.data_received(after)
        if not self.closed:
            self.peer.release_reading(_LOGIN_HOLD)

    def _activate(self, active: codec.ActiveExtensions) -> None:
        self.active = active
        for ext_id, extension in enumerate(active.extensions, 1):
            spec = self.registry.specs[extension.name]
            handler = spec.factory(ExtensionContext(self, extension, ext_id))
            self.handlers[ext_id] = handler
            for command in spec.commands:
                self._commands[command] = handler
            if type(handler).incoming is not ExtensionHandler.incoming:
                self._incoming.append(handler)
        # the window's size and the dotnet id are what the extensions just asked for
        self.output.configure(self.timers, self.window, self.dotnet_id)

    def _refuse_login(self) -> None:
        """Answer a refused login ``login-failure-delay`` late, so that one connection
        cannot try identities fast (the throttle counts failures per address; this paces
        each connection). Meanwhile nothing is read, and the login timeout is off: the
        refusal closes the connection anyway."""
        delay = self.broker.config.login_failure_delay
        if delay > 0:
            self._refusal = self.timers.call_later(delay, self._login_refused)
        else:
            self._login_refused()

    def _login_refused(self) -> None:
        self.protocol_error("login refused", CloseReason.LOGIN_REFUSED)

    def login_timed_out(self) -> None:
        if self._refusal is None:  # a refused login's late answer closes the connection
            super().login_timed_out()

    def _frame(self, frame: codec.Frame) -> None:
        kind = type(frame)
        if kind is codec.MessageFrame:
            self._message(frame)  # type: ignore[arg-type]
        elif kind is codec.ExtensionFrame:
            handler = self.handlers.get(frame.ext_id)  # type: ignore[union-attr]
            if handler is None:
                raise RemoteProtocolError(f"EXTENSION frame for inactive id {frame.ext_id}")  # type: ignore[union-attr]
            handler.extension_frame(frame.payload)  # type: ignore[union-attr]
        elif kind is codec.Command:
            handler = self._commands.get(frame.name)  # type: ignore[union-attr]
            if handler is None:
                raise RemoteProtocolError(f"unknown command {frame.name[:40]!r}")  # type: ignore[union-attr]
            handler.command(frame)  # type: ignore[arg-type]
        else:  # ErrorFrame: the client gives up
            self._refused_by_peer(frame.text)  # type: ignore[union-attr]

    def _message(self, frame: codec.MessageFrame) -> None:
        if not self._reassembler.in_progress:
            expected = codec.next_seq(self.seq_in)
            if frame.seq != expected:
                raise RemoteProtocolError(f"MESSAGE {frame.seq} where {expected} was due")
            self.seq_in = frame.seq
        whole = self._reassembler.feed(frame)
        if whole is None:
            return
        for handler in self._incoming:
            changed = handler.incoming(whole)
            if changed is None:
                return
            whole = changed
        self._route(whole)

    def _batch(self, batch: codec.MessageBatch) -> None:
        """Pipelined MESSAGEs: routed as one run (one destination) or message by message
        without frame objects (a mixed batch) when nothing needs to see them one by one
        (an extension reading messages, a dotnet type, a fragmented message in progress,
        an authorization hook that asks per request or refuses a destination, a unicast);
        else frame by frame."""
        destinations = batch.destinations
        named = (batch.destination,) if destinations is None else set(destinations)
        if (
            self._incoming
            or self.encoding_hint is not None
            or self._reassembler.in_progress
            or any(name.startswith("@") for name in named)
            or (self.broker.authorizes and not self._may_publish_to(named))
        ):
            for frame in batch.frames():
                self._message(frame)
                if self.closed:
                    return
            return
        expected = codec.next_seq(self.seq_in)
        if batch.first_seq != expected:
            raise RemoteProtocolError(f"MESSAGE {batch.first_seq} where {expected} was due")
        payloads = batch.payloads
        last = (batch.first_seq - 1 + len(payloads) - 1) % codec.SEQ_CYCLE + 1
        self.seq_in = last
        session = self.peer
        identity: str = session.identity  # type: ignore[assignment]  # logged in
        if destinations is None:
            run = MessageRun(
                Kind.MCAST, identity, "mm2", batch.destination, len(payloads), lambda: payloads
            )
            self.hub.multicast_run(session, run)
            return
        # a client rotating over topics: what the general path does per frame, less the
        # frame objects and the checks made for the whole batch above
        multicast, mcast = self.hub.multicast, Kind.MCAST
        for destination, payload in zip(destinations, payloads, strict=True):
            multicast(session, Message(mcast, identity, "mm2", destination, payload))

    def _may_publish_to(self, destinations: Iterable[str]) -> bool:
        """Whether an authorization hook that decides per topic allows all ``destinations``
        (asked once each); False also when the hook asks per request."""
        broker = self.broker
        return broker.authorizes_per_topic and all(
            broker.authorize(self.peer, "publish", name) for name in destinations
        )

    def _route(self, frame: codec.MessageFrame) -> None:
        session = self.peer
        identity: str = session.identity  # type: ignore[assignment]  # logged in
        properties = dict(frame.properties) or None
        destination = frame.destination
        hint = self.encoding_hint
        broker = self.broker
        if destination.startswith("@"):
            target = destination[1:]
            if broker.authorizes and not broker.authorize(session, "unicast", target):
                raise NotAuthorized(f"not allowed to unicast to {target[:40]!r}")
            message = Message(Kind.UCAST, identity, "mm2", target, frame.payload, properties,
                              hint)  # fmt: skip
            try:
                self.hub.unicast(message)
            except NoSuchIdentity:
                log.debug("mm2 {who}: unicast to absent {to}", who=identity, to=destination)
            return
        if broker.authorizes and not broker.authorize(session, "publish", destination):
            raise NotAuthorized(f"not allowed to publish to {destination[:40]!r}")
        message = Message(Kind.MCAST, identity, "mm2", destination, frame.payload, properties, hint)
        self.hub.multicast(session, message)

    # -- what the extensions use (ExtensionContext) ------------------------------------------

    def send_extension_frame(self, ext_id: int, payload: bytes) -> None:
        self.reply(codec.encode_frame(codec.ExtensionFrame(ext_id, payload)))

    def acked(self, seq: int) -> None:
        """The client acknowledged every message up to ``seq``: the window opens."""
        if self.output.acknowledge(seq):
            self._window_opened()

    def resume_output(self) -> None:
        """Held output may go on."""
        self.output.release()
        self._window_opened()

    def _window_opened(self) -> None:
        if self.output.ready() and self.peer.subscriptions:
            self.hub.ready(self.peer)  # queue groups may have waiting messages for us

    # -- errors and closing -------------------------------------------------------------------

    def protocol_error(self, text: str, reason: CloseReason = CloseReason.PROTOCOL_ERROR) -> None:
        """An ERROR frame with ``text``, then close (docs/mm2.md); the close detail is
        ``text`` for a protocol error or a request not authorized."""
        if self.closed:
            return
        log.debug("mm2 {host}: {text}", host=self.peer.host, text=text)
        self.reply(codec.encode_frame(codec.ErrorFrame(text[:1000])))
        detailed = reason in (CloseReason.PROTOCOL_ERROR, CloseReason.NOT_AUTHORIZED)
        self.close(reason, text if detailed else "")

    def _refused_by_peer(self, text: str) -> None:
        log.debug("mm2 {host}: the client sent ERROR {text!r}", host=self.peer.host, text=text)
        self.close(CloseReason.PEER)

    def lost(self) -> None:
        for handler in self.handlers.values():
            handler.closed()
        # queue messages never acknowledged go to another member of their group
        taken = self.output.abandon()
        if taken:
            self.hub.redeliver(taken)


def refusal_reason(error: RemoteProtocolError) -> CloseReason:
    """How a session that raised ``error`` closes: a request not authorized, or a broken
    rule (both answered with an ERROR frame)."""
    if isinstance(error, NotAuthorized):
        return CloseReason.NOT_AUTHORIZED
    return CloseReason.PROTOCOL_ERROR
