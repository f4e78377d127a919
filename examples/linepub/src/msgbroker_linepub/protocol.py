"""The linepub server session: sans-IO, on the framework's public API.

The framework's connection adapter feeds it bytes, flushes its output and runs its timers;
it answers with ``self.reply``, routes through ``self.hub`` and asks the broker to decide
logins and permissions — exactly what the built-in protocols do.
"""

from __future__ import annotations

from msgbroker import Accept, Kind, LoginRequest, Message
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

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        self.touch()
        try:
            for request in self._decoder.feed(data):
                self._handle(request)
                if self._ended:
                    return
        except RemoteProtocolError as e:
            self.reply(b"ERR %s\n" % str(e).encode())
            self._end(CloseReason.PROTOCOL_ERROR, str(e))

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
        result = self.broker.login(self.peer, request)
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

