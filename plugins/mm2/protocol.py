"""Micromessage2 server side: the Twisted protocol (handshake, frames, extensions) and the
delivery encoder.

A connection goes through the three-step handshake (the client's hello, our reply, the
client's confirmation; DECISIONS.md), logs its identity in, activates the confirmed
extensions (:mod:`.extensions`), then reads frames: MESSAGEs are routed through the hub
(destination ``@identity``: a unicast), COMMANDs go to the extension that claims their
name, EXTENSION frames to their extension by id. Anything the client gets wrong is an ERROR
frame, then the connection closes.

Deliveries are encoded once per message for every Micromessage2 recipient
(:func:`encode_delivery`) with sequence number 0 in the frame; each connection writes its
own number in (``_deliver``) and applies its flow control (``ack``/``batch-ack`` windows):
messages beyond the window wait on the connection, bounded by ``--max-backlog``.

Before login a connection holds little: a handshake step (or an ERROR frame sent instead)
longer than ``prelogin-max-frame`` is refused as soon as its lengths show it. A refused
login is answered ``login-failure-delay`` late. Micromessage2 has no heartbeat, so dead
peers are found by TCP keepalive (:mod:`.keepalive`).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import Any

from twisted.logger import Logger

from msgbroker.auth import Accept, LoginRequest
from msgbroker.errors import NoSuchIdentity, RemoteProtocolError
from msgbroker.legacy import BrokerProtocol
from msgbroker.message import Kind, Message, MessageRun

from . import codec
from .delivery import encode_delivery, extension_frame, messages, numbered, type_marker
from .extensions import ExtensionContext, ExtensionHandler, Registry
from .frames import CONTINUED, EXTENSION, LARGE
from .keepalive import set_tcp_keepalive

log = Logger(namespace="msgbroker.mm2")

#: the identity our handshake reply gives
SERVER_IDENTITY = "msgbroker"
#: what holding a message for a full ack window costs beyond its frames (the bytes
#: object, the tuple, the deque slot): counted so that a flood of tiny messages is bounded
#: by the memory it takes, not by its frame bytes alone
HELD_OVERHEAD = 100


# -- the protocol ----------------------------------------------------------------------------------


class MM2ServerProtocol(BrokerProtocol):
    """One Micromessage2 connection."""

    name = "mm2"
    encode = staticmethod(encode_delivery)

    def connectionMade(self) -> None:
        super().connectionMade()  # the session, and the login timer: the handshake's
        factory: Any = self.factory
        config = self.broker.config
        # no heartbeat in the protocol: the kernel probes a silent peer (docs/mm2.md)
        set_tcp_keepalive(self.transport, config.keepalive)
        self.registry: Registry = factory.registry
        self._prelogin_max = config.prelogin_max_frame
        self._handshake: codec.HandshakeDecoder | None = codec.HandshakeDecoder(self._prelogin_max)
        #: the delayed answer to a refused login (nothing more is read meanwhile)
        self._refusal: Any = None
        self._hello: codec.Handshake | None = None
        self._reply: codec.Handshake | None = None
        self._frames = codec.FrameDecoder(factory.max_payload)
        self._reassembler = codec.Reassembler(factory.max_message)
        self._closing = False
        self.minor = codec.MINOR
        self.active = codec.ActiveExtensions()
        self.handlers: dict[int, ExtensionHandler] = {}
        self._commands: dict[str, ExtensionHandler] = {}
        self._incoming: list[ExtensionHandler] = []
        #: the last sequence number received, and the last one sent (0: none yet)
        self.seq_in = 0
        self.seq_out = 0
        #: whether our numbers went round (then every number was sent once)
        self.wrapped = False
        #: dotnet: its extension id, the last type we sent, and what the client's
        #: messages carry (set by the dotnet extension)
        self.dotnet_id: int | None = None
        self._type: str | None = None
        self.encoding_hint: str | None = None
        #: sends one cumulative ack for the client's messages (set by ack/batch-ack)
        self.acker: Any = None
        #: flow control: at most ``window`` messages unacknowledged (None: no limit)
        self.window: int | None = None
        #: sent, not yet acknowledged: (seq, queue message and group, or None), oldest first
        self.unacked: deque[tuple[int, Any]] = deque()
        #: messages waiting for the window to open, and their bytes
        self._held: deque[tuple[bytes, Any]] = deque()
        self._held_bytes = 0
        self._cut_off = False  # a slow consumer about to be closed: nothing more for it
        self._write = self.session.send
        self.session.send = self._deliver
        self.session.ready = self._ready
        self.session.deliver_queued = self._deliver_queued

    # -- input --------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._closing or self._refusal is not None:
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
                    if self._closing:
                        break
            if self.acker is not None and not self._closing:
                self.acker()
        except RemoteProtocolError as e:
            self.protocol_error(str(e))
        self.broker.batcher.flush()

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
            if self._closing:
                return b""
            self._handshake = codec.HandshakeDecoder(self._prelogin_max)
            rest = decoder.trailing_data
            return self._handshake_data(rest) if rest else b""
        if not self._confirmed(step):
            return b""  # the login was refused: what followed it is never read
        self._handshake = None
        return decoder.trailing_data

    def _answer_hello(self, hello: codec.Handshake) -> None:
        self.minor = codec.negotiate_minor(hello)  # major 1 only
        if not hello.identity:
            raise RemoteProtocolError("an identity is required")
        codec.check_required(hello.required, self.registry.names)
        # "I suggest Y like you but also Z" (the spec): the client's optional extensions we
        # support, as the client wrote them (its batch-ack window), then our own suggestions
        required = self.registry.required()
        taken = {ext.name for ext in required}
        optional = []
        for ext in (*hello.optional, *self.registry.offered()):
            if ext.name in self.registry.names and ext.name not in taken:
                taken.add(ext.name)
                optional.append(ext)
        reply = codec.Handshake(SERVER_IDENTITY, required, tuple(optional), minor=codec.MINOR)
        self._reply = reply
        self.session.reply(codec.encode_handshake(reply))

    def _confirmed(self, confirm: codec.Handshake) -> bool:
        assert self._hello is not None
        assert self._reply is not None
        active = codec.check_confirm(self._hello, self._reply, confirm, self.registry.names)
        if not self._login(confirm.identity):
            return False
        self.active = active
        for ext_id, extension in enumerate(active.extensions, 1):
            spec = self.registry.specs[extension.name]
            handler = spec.factory(ExtensionContext(self, extension, ext_id))
            self.handlers[ext_id] = handler
            for command in spec.commands:
                self._commands[command] = handler
            if type(handler).incoming is not ExtensionHandler.incoming:
                self._incoming.append(handler)
        return True

    def _login(self, identity: str) -> bool:
        names = self.peer_certificate_names()
        enabled = self.broker.enabled_schemes
        scheme = "cert" if names is not None and "cert" in enabled else "open"
        request = LoginRequest("mm2", identity, scheme, None, self.session.host, names)
        result = self.broker.login(self.session, request)
        if not isinstance(result, Accept):
            self._refuse_login()
            return False
        self.logged_in()
        return True

    def _refuse_login(self) -> None:
        """Answer a refused login ``login-failure-delay`` late, so that one connection
        cannot try identities fast (the throttle counts failures per address; this paces
        each connection). Meanwhile nothing is read, and the login timeout is off: the
        refusal closes the connection anyway."""
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None
        delay = self.broker.config.login_failure_delay
        if delay > 0:
            self._refusal = self.clock.callLater(delay, self._login_refused)
        else:
            self._login_refused()

    def _login_refused(self) -> None:
        self.protocol_error("login refused", reason="login refused")

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
        """Pipelined MESSAGEs to one destination: routed as one run when nothing needs to
        see them one by one (an extension reading messages, a dotnet type, a fragmented
        message in progress, an authorization hook, a unicast); else frame by frame."""
        destination = batch.destination
        if (
            self._incoming
            or self.encoding_hint is not None
            or self._reassembler.in_progress
            or self.broker.authorizes
            or destination.startswith("@")
        ):
            for frame in batch.frames():
                self._message(frame)
                if self._closing:
                    return
            return
        expected = codec.next_seq(self.seq_in)
        if batch.first_seq != expected:
            raise RemoteProtocolError(f"MESSAGE {batch.first_seq} where {expected} was due")
        payloads = batch.payloads
        last = (batch.first_seq - 1 + len(payloads) - 1) % codec.SEQ_CYCLE + 1
        self.seq_in = last
        session = self.session
        identity: str = session.identity
        run = MessageRun(Kind.MCAST, identity, "mm2", destination, len(payloads), lambda: payloads)
        self.hub.multicast_run(session, run)

    def _route(self, frame: codec.MessageFrame) -> None:
        session = self.session
        identity: str = session.identity
        properties = dict(frame.properties) or None
        destination = frame.destination
        hint = self.encoding_hint
        if destination.startswith("@"):
            message = Message(Kind.UCAST, identity, "mm2", destination[1:], frame.payload,
                              properties, hint)  # fmt: skip
            try:
                self.hub.unicast(message)
            except NoSuchIdentity:
                log.debug("mm2 {who}: unicast to absent {to}", who=identity, to=destination)
            return
        broker = self.broker
        if broker.authorizes and not broker.authorize(session, "publish", destination):
            raise RemoteProtocolError(f"not allowed to publish to {destination[:40]!r}")
        message = Message(Kind.MCAST, identity, "mm2", destination, frame.payload, properties, hint)
        self.hub.multicast(session, message)

    # -- output -------------------------------------------------------------------------------

    def send_frame(self, frame: codec.Frame) -> None:
        self.session.reply(codec.encode_frame(frame))

    def send_extension_frame(self, ext_id: int, payload: bytes) -> None:
        self.session.reply(codec.encode_frame(codec.ExtensionFrame(ext_id, payload)))

    def _deliver(self, data: bytes, queued: Any = None) -> None:
        """What the hub sends (one or several messages' frames, seq 0): numbered and
        written while the window allows, held otherwise."""
        if queued is None and not self._held:
            window = self.window
            room = None if window is None else window - len(self.unacked)
            numbered = self._number_all(data, room)
            if numbered is not None:
                self._write(numbered)
                return
        pieces = messages(data) if queued is None else (data,)
        if self._cut_off:
            self._dropped(len(pieces))
            return
        held = self._held
        for piece in pieces:
            held.append((piece, queued))
            self._held_bytes += len(piece) + HELD_OVERHEAD
        self._release()
        policy = self.broker.policy
        if self._held_bytes <= policy.max_backlog:  # what the window keeps back
            return
        if policy.drop:  # --slow-consumer drop: the newest that do not fit are discarded
            count = 0
            while self._held_bytes > policy.max_backlog and held and held[-1][1] is None:
                self._held_bytes -= len(held.pop()[0]) + HELD_OVERHEAD
                count += 1
            self._dropped(count)
            return
        self._cut_off = True
        # queue messages among them go back to their group when the connection is lost
        self._dropped(sum(1 for _piece, q in held if q is None))
        # not now: the hub may be iterating over the recipients this close removes
        self.clock.callLater(0, self.session.close, "slow consumer")

    def _dropped(self, count: int) -> None:
        """``count`` deliveries discarded by the slow-consumer policy: counted as the
        session counts its own (hub stats, the session, the broker's rate-limited log)."""
        if not count:
            return
        session = self.session
        session.stats.dropped += count
        session.dropped += count
        if session.on_dropped is not None:
            session.on_dropped(session, count)

    def _deliver_queued(self, frame: bytes, message: Message, group: Any) -> None:
        self._deliver(frame, (message, group) if self.window is not None else None)

    def _number_all(self, data: bytes, room: int | None) -> bytes | None:
        """``data`` with every MESSAGE numbered in one pass, when all of it fits in the
        window's ``room`` (None: no window); None (nothing done) when it does not, or when
        it holds a dotnet marker: then message by message."""
        out = bytearray(data)
        pos, size = 0, len(out)
        seq = self.seq_out
        current = 1 if seq == 0xFFFF else seq + 1
        numbers = []
        while pos < size:
            flags = out[pos]
            if flags & EXTENSION:
                return None
            out[pos + 1] = current >> 8
            out[pos + 2] = current & 0xFF
            at = pos + 4 + out[pos + 3]
            at += 2 + (out[at] << 8 | out[at + 1])
            if flags & LARGE:
                pos = at + 4 + int.from_bytes(out[at : at + 4], "big")
            else:
                pos = at + 1 + out[at]
            if not flags & CONTINUED:
                seq = current
                numbers.append(seq)
                current = 1 if seq == 0xFFFF else seq + 1
        if room is not None:
            if len(numbers) > room:
                return None
            self.unacked.extend(zip(numbers, repeat(None)))
        if 0xFFFF in numbers:
            self.wrapped = True
        self.seq_out = seq
        return bytes(out)

    def _ready(self) -> bool:
        # a connection about to be closed takes no queue message: another member should
        return not self._held and self._has_room() and not self._cut_off

    def _has_room(self) -> bool:
        return self.window is None or len(self.unacked) < self.window

    def _send_numbered(self, piece: bytes, queued: Any) -> None:
        type_name, piece = type_marker(piece)
        if type_name is not None and self.dotnet_id is not None and type_name != self._type:
            self._type = type_name
            self._write(extension_frame(self.dotnet_id, type_name.encode("utf-8")))
        self.seq_out = seq = codec.next_seq(self.seq_out)
        if seq == codec.SEQ_CYCLE:
            self.wrapped = True
        if self.window is not None:
            self.unacked.append((seq, queued))
        self._write(numbered(piece, seq))

    def acked(self, seq: int) -> None:
        """The client acknowledged every message up to ``seq``: the window opens."""
        unacked = self.unacked
        if not unacked:
            return
        count = codec.acked_count(unacked[0][0], len(unacked), seq)
        for _ in range(count):
            unacked.popleft()
        if count:
            self.resume_output()

    def resume_output(self) -> None:
        self._release()
        if not self._held and self.window is not None and self.session.subscriptions:
            self.hub.ready(self.session)  # queue groups may have waiting messages for us

    def _release(self) -> None:
        """Send held messages while the window has room: consecutive plain ones (not from
        a queue group) joined and numbered in one pass, the others one by one. Nothing
        once cut off: those were counted as dropped, and queue messages among them go back
        to their group when the connection is lost."""
        if self._cut_off:
            return
        held, window, unacked = self._held, self.window, self.unacked
        while held and (window is None or len(unacked) < window):
            room = None if window is None else window - len(unacked)
            take: list[bytes] = []
            while held and held[0][1] is None and (room is None or len(take) < room):
                take.append(held.popleft()[0])
            if not take:
                piece, queued = held.popleft()
                self._held_bytes -= len(piece) + HELD_OVERHEAD
                self._send_numbered(piece, queued)
                continue
            self._held_bytes -= sum(map(len, take)) + HELD_OVERHEAD * len(take)
            numbered = self._number_all(b"".join(take), room)
            if numbered is not None:
                self._write(numbered)
            else:  # a dotnet marker among them
                for piece in take:
                    self._send_numbered(piece, None)

    # -- errors and closing -------------------------------------------------------------------

    def protocol_error(self, text: str, reason: str | None = None) -> None:
        """An ERROR frame with ``text``, then close (DECISIONS.md); the session's close
        ``reason`` is ``protocol error: TEXT`` unless given."""
        if self._closing:
            return
        log.debug("mm2 {host}: {text}", host=self.session.host, text=text)
        self.session.reply(codec.encode_frame(codec.ErrorFrame(text[:1000])))
        self.session.close(reason or f"protocol error: {text}")

    def _refused_by_peer(self, text: str) -> None:
        log.debug("mm2 {host}: the client sent ERROR {text!r}", host=self.session.host, text=text)
        self.session.close("closed by peer")

    def close_connection(self, reason: str) -> None:
        self._closing = True
        super().close_connection(reason)

    def send_keepalive(self) -> None:
        """Micromessage2 has no heartbeat: TCP keepalive finds dead peers instead."""

    def logged_in(self) -> None:
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        # no idle timer: a healthy Micromessage2 peer may be silent for hours, and the
        # protocol has no ping to tell it from a dead one (TCP keepalive does that)
        self._login_timer = None

    def connectionLost(self, reason: Any = None) -> None:
        self._closing = True
        if self._refusal is not None and self._refusal.active():
            self._refusal.cancel()
        for handler in self.handlers.values():
            handler.closed()
        super().connectionLost(reason)
        # queue messages never acknowledged go to another member of their group
        pending = [q for _seq, q in self.unacked if q is not None]
        pending += [q for _piece, q in self._held if q is not None]
        self.unacked.clear()
        self._held.clear()
        by_group: dict[Any, list[Any]] = {}
        for message, group in pending:  # oldest first, kept in order per group
            by_group.setdefault(group, []).append(message)
        for group, unacknowledged in by_group.items():
            self.hub.stats.delivered += group.redeliver_all(unacknowledged)
