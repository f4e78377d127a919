"""The linepub server session: sans-IO, on the framework's public API.

The framework's connection adapter feeds it bytes, flushes its output and runs its timers;
it answers with ``self.reply``, routes through ``self.hub`` and asks the broker to decide
logins and permissions — exactly what the built-in protocols do.
"""

from __future__ import annotations

from msgbroker import Accept, AuthResult, Kind, LoginRequest, Message
from msgbroker.connection import ServerSession
from msgbroker.errors import (
    AlreadySubscribed,
    LimitExceeded,
    NotAllowed,
    NotSubscribed,
    RemoteProtocolError,
)
from msgbroker.reasons import CloseReason

from . import codec
from .hookspecs import linepub_motd

OK = b"OK\n"
PONG = b"PONG\n"
#: the broker's keepalive: a client answers it with a PING request of its own
PING = b"PING\n"
#: who holds the peer's reading while its login is decided
_LOGIN_HOLD = "linepub login"


def encode_message(message: Message) -> bytes | None:
    """What a linepub client receives for ``message`` (from any protocol): MCASTs only."""
    if message.kind is not Kind.MCAST or message.topic is None:
        return None
    try:
        text = message.payload.decode("utf-8")
    except UnicodeDecodeError:
        return None  # not text: the hub counts this recipient as skipped
    return codec.encode_delivery(message.topic, message.sender, text)


class LineServerSession(ServerSession):
    """One linepub connection."""

    name = "linepub"
    encode = staticmethod(encode_message)

    def opened(self) -> None:
        self._decoder = codec.LineDecoder()
        self._ended = False
        #: requests that came while the login is decided (None: no login pending)
        self._waiting: list[codec.Request] | None = None

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self.touch()
        try:
            self._handle_all(self._decoder.feed(data))
        except RemoteProtocolError as e:
            self._broken(e)

    def _handle_all(self, requests: list[codec.Request]) -> None:
        for request in requests:
            if self._waiting is not None:  # after a HELLO not yet decided: in order, later
                self._waiting.append(request)
                continue
            self._handle(request)
            if self._ended:
                return

    def _broken(self, error: RemoteProtocolError) -> None:
        self.reply(b"ERR %s\n" % str(error).encode())
        self._end(CloseReason.PROTOCOL_ERROR, str(error))

    def _handle(self, request: codec.Request) -> None:
        peer = self.peer
        if peer.identity is None:
            if not isinstance(request, codec.Hello):
                raise RemoteProtocolError("say HELLO first")
            self._hello(request)
        elif isinstance(request, codec.Pub):
            self._pub(request)
        elif isinstance(request, codec.Sub):
            self._sub(request)
        elif isinstance(request, codec.Unsub):
            self._unsub(request)
        elif isinstance(request, codec.Ping):
            self.reply(PONG)
        elif isinstance(request, codec.Bye):
            self.reply(OK)
            self._end(CloseReason.REQUESTED)
        else:
            raise RemoteProtocolError("HELLO twice")

    def _hello(self, hello: codec.Hello) -> None:
        request = LoginRequest(
            protocol=self.name,
            identity=hello.identity,
            scheme=hello.scheme,
            credential=hello.credential,
            host=self.peer.host,
            tls_names=self.certificate_names(),
        )
        # a scheme may answer later (password: a hash checked in a thread): until then the
        # requests that follow wait, and the peer's input with them
        self._waiting = []
        self.broker.begin_login(self.peer, request, self._login_decided)
        if self._waiting is not None:
            self.peer.hold_reading(_LOGIN_HOLD)

    def _login_decided(self, result: AuthResult) -> None:
        waiting, self._waiting = self._waiting or [], None
        self.peer.release_reading(_LOGIN_HOLD)
        if not isinstance(result, Accept):
            # like every built-in: answered late, and nothing after it is read
            self._ended = True
            self.timers.call_later(self.broker.config.login_failure_delay, self._refuse)
            return
        self.logged_in()
        self.reply(OK)
        motd = self.greeting()
        if motd:
            self.reply(b"MOTD %s\n" % motd.encode("utf-8"))
        try:
            self._handle_all(waiting)
        except RemoteProtocolError as e:
            self._broken(e)

    def greeting(self) -> str | None:
        """The message of the day for a client that just logged in: the plugins that
        implement linepub's own hook decide (:mod:`msgbroker_linepub.hookspecs`)."""
        identity: str = self.peer.identity  # type: ignore[assignment]
        return linepub_motd(self.broker.plugins, self.broker, identity)

    def _refuse(self) -> None:
        self.reply(b"NO login refused\n")
        self.close(CloseReason.LOGIN_REFUSED)

    def _pub(self, pub: codec.Pub) -> None:
        if not self._allowed("publish", pub.topic):
            return
        identity: str = self.peer.identity  # type: ignore[assignment]
        message = Message(Kind.MCAST, identity, self.name, pub.topic, pub.text.encode("utf-8"))
        self.hub.multicast(self.peer, message)
        self.reply(OK)

    def _sub(self, sub: codec.Sub) -> None:
        if not self._allowed("subscribe", sub.topic):
            return
        try:
            self.hub.subscribe(self.peer, sub.topic, False)
        except AlreadySubscribed:
            self.reply(b"NO already subscribed\n")
        except LimitExceeded as e:
            self.reply(b"NO %s\n" % str(e).encode())
        except NotAllowed:
            self.reply(b"NO not allowed\n")
        else:
            self.reply(OK)

    def _unsub(self, unsub: codec.Unsub) -> None:
        try:
            self.hub.unsubscribe(self.peer, unsub.topic)
        except NotSubscribed:
            self.reply(b"NO not subscribed\n")
        except NotAllowed:
            self.reply(b"NO not allowed\n")
        else:
            self.reply(OK)

    def _allowed(self, action: str, topic: str) -> bool:
        broker = self.broker
        if broker.authorizes and not broker.authorize(self.peer, action, topic):
            self.reply(b"NO not allowed\n")
            return False
        return True

    def send_keepalive(self) -> None:
        self.reply(PING)

    def _end(self, reason: CloseReason, detail: str = "") -> None:
        self._ended = True
        self.close(reason, detail)

