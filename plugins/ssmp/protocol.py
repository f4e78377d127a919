"""The SSMP server session: requests in (through the codec), hub calls and replies out.

Sans-IO: the framework's connection adapter feeds it bytes and runs its timers."""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from msgbroker.auth import Accept, AuthResult, LoginRequest
from msgbroker.connection import ServerSession
from msgbroker.errors import (
    AlreadySubscribed,
    NoSuchIdentity,
    NotAllowed,
    NotSubscribed,
    RemoteProtocolError,
)
from msgbroker.message import Kind, Message, MessageRun
from msgbroker.reasons import ABORTED, CloseReason

from . import codec

log = Logger(namespace="msgbroker.ssmp")

OK = b"200\n"
BAD_REQUEST = b"400\n"
NOT_FOUND = b"404\n"
NOT_ALLOWED = b"405\n"
CONFLICT = b"409\n"
NOT_IMPLEMENTED = b"501\n"
PONG_EVENT = b"000 . PONG\n"
PING_EVENT = b"000 . PING\n"
#: holds the peer's input while its LOGIN is checked (Session.hold_reading)
_LOGIN_HOLD = "ssmp.login"

_VERB = {
    Kind.MCAST: b"MCAST",
    Kind.UCAST: b"UCAST",
    Kind.BCAST: b"BCAST",
    Kind.SUBSCRIBE: b"SUBSCRIBE",
    Kind.UNSUBSCRIBE: b"UNSUBSCRIBE",
}
# Module-level on purpose: a pure function of the id (whether it is a valid SSMP id, and its
# bytes), the same for every broker in the process; bounded by clearing it past 8,192 ids.
_valid_ids: dict[str, bytes | None] = {}


def _wire_id(value: str | None) -> bytes | None:
    """``value`` as SSMP id bytes, or None if it is not a valid SSMP id (memoized)."""
    if value is None:
        return None
    known = _valid_ids.get(value, False)
    if known is not False:
        return known  # type: ignore[return-value]
    wire = value.encode("ascii") if codec.is_valid_id(value) else None
    if len(_valid_ids) > 8192:
        _valid_ids.clear()
    _valid_ids[value] = wire
    return wire


def encode_message(message: Message) -> bytes | None:
    """The SSMP event for ``message``, or None when SSMP cannot carry it (a sender or topic
    that is not a valid SSMP id, an empty payload or one over 1024 bytes)."""
    sender = _wire_id(message.sender)
    if sender is None:
        return None
    kind = message.kind
    if kind is Kind.BCAST:
        wire = codec.encode_payload(message.payload)
        return None if wire is None else b"000 %s BCAST %s\n" % (sender, wire)
    topic = _wire_id(message.topic)
    if topic is None:
        return None
    if kind is Kind.SUBSCRIBE:
        option = b" PRESENCE" if message.presence else b""
        return b"000 %s SUBSCRIBE %s%s\n" % (sender, topic, option)
    if kind is Kind.UNSUBSCRIBE:
        return b"000 %s UNSUBSCRIBE %s\n" % (sender, topic)
    wire = codec.encode_payload(message.payload)
    if wire is None:
        return None
    return b"000 %s %s %s %s\n" % (sender, _VERB[kind], topic, wire)


class SSMPServerSession(ServerSession):
    """One SSMP connection on the server side."""

    name = "ssmp"
    encode = staticmethod(encode_message)
    #: the spec: a login timeout closes *without* a response
    aborted_on = ABORTED | {CloseReason.LOGIN_TIMEOUT}

    def opened(self) -> None:
        self._decoder = codec.RequestDecoder()
        self._prefix = b""
        self._closing = False
        self._handle = self._handle_before_login
        #: what arrived after a LOGIN still being checked (a request, or a grammar error's
        #: text), handled in order once it is decided
        self._held: list[codec.Request | str] = []
        self._login_pending = False

    # Replies go through ``self.reply``, events through ``self.peer.send``: both within the
    # output budget (a client that floods requests without reading is a slow consumer too),
    # but a reply is never dropped, since that would break the request/reply pairing.

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        keepalive = self.keepalive
        if keepalive is not None:
            keepalive.touch()
        try:
            for event in self._decoder.feed(data):
                self._handle(event)
                if self._closing:
                    break
        except RemoteProtocolError as e:
            if self._login_pending:  # answered in its turn, after the LOGIN
                self._held.append(str(e))
            else:
                self._bad_request(str(e))

    # -- before login ------------------------------------------------------------------------

    def _handle_before_login(self, event: codec.Request) -> None:
        if type(event) is not codec.Login:
            self._bad_request("first request is not LOGIN")
            return
        session = self.peer
        request = LoginRequest(
            protocol=self.name,
            identity=event.identity,
            scheme=event.scheme,
            credential=event.credential,
            host=session.host,
            tls_names=self.certificate_names(),
        )
        # the scheme may answer later (password: a hash checked in a thread); what
        # follows the LOGIN waits for the answer, and the peer's input with it
        self._login_pending = True
        self._handle = self._hold_request
        self.broker.begin_login(session, request, self._login_decided)
        if self._login_pending:
            session.hold_reading(_LOGIN_HOLD)

    def _hold_request(self, event: codec.Request) -> None:
        self._held.append(event)

    def _login_decided(self, result: AuthResult) -> None:
        self._login_pending = False
        session = self.peer
        if not isinstance(result, Accept):
            # answered late (login-failure-delay), so guessing is slow; nothing after the
            # LOGIN is read: the connection closes with the answer
            self._closing = True
            self._held.clear()
            self.timers.call_later(self.broker.config.login_failure_delay, self._refuse_login)
            return
        identity = session.identity or result.identity
        self._prefix = b"000 %s " % identity.encode("ascii")
        self._handle = self._handle_request
        self.logged_in()
        self.reply(OK)
        held, self._held = self._held, []
        try:
            for event in held:
                if self._closing:
                    break
                if isinstance(event, str):
                    self._bad_request(event)
                else:
                    self._handle(event)
        except RemoteProtocolError as e:
            self._bad_request(str(e))
        if not self._closing:
            session.release_reading(_LOGIN_HOLD)

    def _refuse_login(self) -> None:
        if not self.closed:
            self.reply(codec.encode_reply(401, " ".join(self.broker.enabled_schemes).encode()))
            self.close(CloseReason.LOGIN_REFUSED)

    # -- after login -------------------------------------------------------------------------

    def _handle_request(self, event: codec.Request) -> None:
        _DISPATCH[type(event)](self, event)

    def _mcast(self, event: codec.Mcast) -> None:
        session = self.peer
        if self.broker.authorizes and not self.broker.authorize(session, "publish", event.topic):
            self.reply(NOT_ALLOWED)
            return
        # the request line is the event's text: prefixed, it is what SSMP members get
        self.hub.multicast_frame(
            session, event.topic, event.payload, encode_message, self._prefix + event.line + b"\n"
        )
        self.reply(OK)

    def _mcast_run(self, event: codec.McastRun) -> None:
        """Pipelined MCASTs to one topic: routed as one run, answered with one write."""
        broker = self.broker
        if broker.authorizes:
            if not broker.authorizes_per_topic:  # each request is asked about: one by one
                skip = len(b"MCAST  ") + len(event.topic)
                for line in event.block.split(b"\n")[:-1]:
                    self._mcast(codec.Mcast(event.topic, line[skip:], line))
                return
            if not broker.authorize(self.peer, "publish", event.topic):  # for every one
                self.reply(NOT_ALLOWED * event.count)
                return
        identity: str = self.peer.identity  # type: ignore[assignment]
        run = MessageRun(
            Kind.MCAST,
            identity,
            "ssmp",
            event.topic,
            event.count,
            event.payloads,
            total_bytes=event.payload_bytes,
        )
        prefix = self._prefix
        # "000 <from> " before every request line: the run's SSMP encoding in one C call
        run.preencode(
            encode_message, prefix + event.block[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
        )
        self.hub.multicast_run(self.peer, run)
        self.reply(OK * event.count)

    def _mcast_block(self, event: codec.McastBlock) -> None:
        """Pipelined MCASTs, each to another topic than the one before: routed one by one,
        but without an event or a Message each (``Hub.multicast_frames``), and answered
        with one write."""
        if self.broker.authorizes:  # each request is asked about: one by one
            for mcast in event.expand():
                self._mcast(mcast)
            return
        self.hub.multicast_frames(
            self.peer, encode_message, event.topics, event.prefixed(self._prefix), event.payloads
        )
        self.reply(OK * event.count)

    def _ucast(self, event: codec.Ucast) -> None:
        session = self.peer
        if self.broker.authorizes and not self.broker.authorize(session, "unicast", event.target):
            self.reply(NOT_ALLOWED)
            return
        frame = self._prefix + event.line + b"\n"
        try:
            self.hub.unicast_frame(session, event.target, event.payload, encode_message, frame)
        except NoSuchIdentity:
            self.reply(NOT_FOUND)
            return
        self.reply(OK)

    def _bcast(self, event: codec.Bcast) -> None:
        session = self.peer
        if self.broker.authorizes and not self.broker.authorize(session, "broadcast", None):
            self.reply(NOT_ALLOWED)
            return
        message = Message(Kind.BCAST, session.identity, "ssmp", None, event.payload)  # type: ignore[arg-type]
        message.preencode(encode_message, self._prefix + event.line + b"\n")
        try:
            self.hub.broadcast(session, message)
        except NotAllowed:
            self.reply(NOT_ALLOWED)
            return
        self.reply(OK)

    def _subscribe(self, event: codec.Subscribe) -> None:
        session = self.peer
        if self.broker.authorizes and not self.broker.authorize(session, "subscribe", event.topic):
            self.reply(NOT_ALLOWED)
            return
        try:
            snapshot = self.hub.subscribe(session, event.topic, event.presence)
        except NotAllowed:
            self.reply(NOT_ALLOWED)
            return
        except AlreadySubscribed:
            self.reply(CONFLICT)
            return
        self.reply(OK)
        for message in snapshot:
            frame = message.encoded(encode_message)
            if frame is not None:
                self.peer.send(frame)

    def _unsubscribe(self, event: codec.Unsubscribe) -> None:
        try:
            self.hub.unsubscribe(self.peer, event.topic)
        except NotAllowed:
            self.reply(NOT_ALLOWED)
            return
        except NotSubscribed:
            self.reply(NOT_FOUND)
            return
        self.reply(OK)

    def _login_again(self, event: codec.Login) -> None:
        self.reply(NOT_ALLOWED)
        self._close(CloseReason.PROTOCOL_ERROR, "second LOGIN")

    def _ping(self, event: codec.Ping) -> None:
        self.reply(PONG_EVENT)

    def _pong(self, event: codec.Pong) -> None:
        pass  # never answer a PONG; receiving it already counted as activity

    def _close_request(self, event: codec.Close) -> None:
        self.reply(OK)
        self._close(CloseReason.REQUESTED)

    def _unknown(self, event: codec.UnknownVerb) -> None:
        self.reply(NOT_IMPLEMENTED)

    # -- closing -----------------------------------------------------------------------------

    def send_keepalive(self) -> None:
        self.peer.send(PING_EVENT)

    def _bad_request(self, why: str) -> None:
        log.debug("ssmp {host}: 400: {why}", host=self.peer.host, why=why)
        self.reply(BAD_REQUEST)
        self._close(CloseReason.PROTOCOL_ERROR, why)

    def _close(self, reason: CloseReason, detail: str = "") -> None:
        self._closing = True
        self.close(reason, detail)

    def login_timed_out(self) -> None:
        self._closing = True
        super().login_timed_out()


_DISPATCH: dict[type, Any] = {
    codec.Mcast: SSMPServerSession._mcast,
    codec.McastRun: SSMPServerSession._mcast_run,
    codec.McastBlock: SSMPServerSession._mcast_block,
    codec.Ucast: SSMPServerSession._ucast,
    codec.Bcast: SSMPServerSession._bcast,
    codec.Subscribe: SSMPServerSession._subscribe,
    codec.Unsubscribe: SSMPServerSession._unsubscribe,
    codec.Login: SSMPServerSession._login_again,
    codec.Ping: SSMPServerSession._ping,
    codec.Pong: SSMPServerSession._pong,
    codec.Close: SSMPServerSession._close_request,
    codec.UnknownVerb: SSMPServerSession._unknown,
}
