"""Shared infrastructure of the STMP client tests (``test_client_*.py``, and ``test_cli.py``
uses the fake server).

Timers (request timeouts, heartbeat) and misbehaving servers are driven with a ``Clock`` and
a ``StringTransport`` (:class:`Wire`). Everything that needs real sockets runs against
:class:`FakeSTMPServer`, a small STMP server built here on the codec and the client kit's
:class:`~msgbroker.clientkit.testing.FakeServer` (not the broker): it answers the version
check (or refuses it), logs in anybody, routes publish/unicast/broadcast between its own
connections like the broker's built-in actions (a broadcast reaches the peers sharing a
topic with the sender, as docs/stmp.md says), and has test actions that echo, reply late,
never reply, notify back or answer a chosen status.

Tests marked ``# real broker:`` exercise behaviour the broker implements too: they take the
``target`` (or ``tls_target``) fixture and run against the fake and against a real broker
(``running_broker`` with ``stmp`` and ``stmp-ws`` listeners, plain and TLS, in the shared
reactor thread), over TCP and WebSocket; what only the fake can show (its record of
requests, its test actions) is checked on the fake alone. The rest (timeouts, late replies,
refused versions, silent servers, wire details) need a server that misbehaves on purpose
and stay on the fake. The fixtures themselves live in the test modules and ``conftest.py``;
the helpers they are built on (:func:`fake_or_broker`, :func:`stmp_broker`) are here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from attrs import frozen
from twisted.internet import defer
from twisted.internet.task import Clock, LoopingCall

from msgbroker.clientkit.testing import FakeConnection as KitFakeConnection
from msgbroker.clientkit.testing import FakeServer, MemoryWire
from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.client import BlockingSTMPClient, STMPClientProtocol, connect
from msgbroker.plugins.stmp.codec import (
    PING,
    BinaryDecoder,
    Encoding,
    Message,
    Notify,
    Request,
    Response,
    Status,
    TextDecoder,
    decode_versions,
    encode_binary,
    encode_text,
    encode_versions,
    parse_action,
)
from tests.ssmp.e2e_support import (
    ReactorThread,
    RunningBroker,
    parse_address,
    running_broker,
)

JSON, MSGPACK, RAW = Encoding.JSON, Encoding.MSGPACK, Encoding.RAW
ECHO = parse_action("1.0.0.1")  # reply Ok with the request's encoding and payload
DELAY = parse_action("1.0.0.2")  # {"delay": s}: reply Ok {"late": true} after s seconds
SILENT = parse_action("1.0.0.3")  # never reply
NOTIFY_BACK = parse_action("1.0.0.4")  # notify 1.0.0.4 with the payload, then reply Ok
STATUS = parse_action("1.0.0.5")  # {"status": n}: reply n with {"why": "asked"}


# -- a fake STMP server ------------------------------------------------------------------------


class FakeConnection(KitFakeConnection):
    """One client connection of :class:`FakeSTMPServer` (lives in the reactor thread)."""

    def __init__(self, server: FakeSTMPServer, transport: Any) -> None:
        super().__init__(server, transport)
        self.text = server.ws
        self.decoder: Any = TextDecoder() if server.ws else BinaryDecoder()
        self.binary_frames = False
        self.identity: str | None = None
        self.encoding = JSON
        self.topics: set[str] = set()
        self.pinger: LoopingCall | None = None

    def send(self, message: Message, inline: bool | None = None) -> None:
        if not self.text:
            self.write(encode_binary(message))
        elif self.binary_frames:
            self.write((True, encode_binary(message, with_ps=False)))
        else:
            text, followup = encode_text(message, inline)
            self.write((False, text.encode()))
            if followup is not None:
                self.write((True, followup))

    def deliver(self, sender: str, kind: str, topic: str | None, data: bytes | None) -> None:
        fields = payloads.delivery_fields(sender, kind, topic, data, self.encoding)
        payload = payloads.encode_payload(fields, self.encoding)
        self.send(Notify(payloads.DELIVERY, self.encoding, payload))


class FakeSTMPServer(FakeServer):
    """A fake STMP server on a loopback port in the shared reactor thread: TCP (binary) or
    WebSocket (``ws``: text frames, or binary frames when the client sends those), plain or
    TLS (``tls``: a server context). ``versions`` are the versions it accepts; the reply to
    the version check goes inline in text mode unless ``version_inline=False`` (then as the
    two-frame form, like the broker). ``ping_every`` makes it send heartbeats. ``secret``
    makes login check the credential. Tests may replace entries of ``behaviour``. Its log
    holds the STMP messages clients sent (``None`` once a connection ended)."""

    connection_class = FakeConnection

    def __init__(
        self,
        thread: ReactorThread,
        *,
        ws: bool = False,
        tls: Any = None,
        versions: tuple[tuple[int, int], ...] = ((0, 1),),
        version_inline: bool = True,
        ping_every: float | None = None,
        secret: str | None = None,
    ) -> None:
        super().__init__(thread, ws=ws, tls=tls)
        self.versions = versions
        self.version_inline = version_inline
        self.ping_every = ping_every
        self.secret = secret
        #: what TCP clients sent, as received; WebSocket frames (is_binary, payload)
        self.raw: list[bytes] = []
        self.frames: list[tuple[bool, bytes]] = []
        self.behaviour: dict[int, Callable[[FakeSTMPServer, FakeConnection, Request], None]] = {
            0: FakeSTMPServer.version_check,
            payloads.LOGIN: FakeSTMPServer.login,
            payloads.SUBSCRIBE: FakeSTMPServer.subscribe,
            payloads.UNSUBSCRIBE: FakeSTMPServer.unsubscribe,
            payloads.PUBLISH: FakeSTMPServer.publish,
            payloads.UNICAST: FakeSTMPServer.unicast,
            payloads.BROADCAST: FakeSTMPServer.broadcast,
            ECHO: FakeSTMPServer.echo,
            DELAY: FakeSTMPServer.delay,
            SILENT: lambda server, conn, request: None,
            NOTIFY_BACK: FakeSTMPServer.notify_back,
            STATUS: FakeSTMPServer.status,
        }

    # -- the kit's hooks (reactor thread) -----------------------------------------------------

    def connected(self, conn: FakeConnection) -> None:
        if self.ping_every:
            conn.pinger = LoopingCall(conn.send, PING)
            conn.pinger.clock = self.thread.reactor
            conn.pinger.start(self.ping_every, now=False)

    def received(self, conn: FakeConnection, unit: Any) -> None:
        try:
            if not conn.text:
                self.raw.append(unit)
                messages = list(conn.decoder.feed(unit))
            else:
                self.frames.append(unit)
                binary, payload = unit
                if binary:
                    if not conn.decoder.waiting_for_payload:
                        conn.binary_frames = True
                    message = conn.decoder.binary_frame(payload)
                else:
                    message = conn.decoder.text_frame(payload.decode())
                messages = [] if message is None else [message]
        except RemoteProtocolError:
            conn.abort()
            return
        for message in messages:
            self.record(conn, message)
            if type(message) is Request:
                self.behaviour.get(message.action, FakeSTMPServer.not_found)(self, conn, message)

    def lost(self, conn: FakeConnection) -> None:
        if conn.pinger is not None and conn.pinger.running:
            conn.pinger.stop()

    def requests(self, action: int) -> list[Request]:
        return [m for m in self.logged(Request) if m.action == action]

    # -- behaviour ----------------------------------------------------------------------------

    @staticmethod
    def reply(conn: FakeConnection, request: Request, status: int = Status.OK,
              value: Any = None) -> None:  # fmt: skip
        if value is None:
            conn.send(Response(request.id, status))
            return
        encoding = request.encoding if request.encoding in (JSON, MSGPACK) else JSON
        conn.send(Response(request.id, status, encoding, payloads.encode_payload(value, encoding)))

    def version_check(self, conn: FakeConnection, request: Request) -> None:
        text = conn.text and not conn.binary_frames
        offered = decode_versions(request.payload, text=text)
        chosen = next((v for v in offered if v in self.versions), None)
        if chosen is None:
            conn.send(Response(0, Status.VERSION_NOT_SUPPORTED))
            conn.drop()
            return
        payload = encode_versions([chosen], text=text)
        conn.send(Response(0, Status.OK, RAW, payload), inline=self.version_inline or None)

    def login(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        if self.secret is not None and fields.get("credential") != self.secret:
            self.reply(conn, request, Status.UNAUTHORIZED, {"schemes": ["secret"]})
            return
        conn.identity, conn.encoding = fields["id"], request.encoding
        self.reply(conn, request)

    def subscribe(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        conn.topics.add(fields["topic"])
        self.reply(conn, request)

    def unsubscribe(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        if fields["topic"] not in conn.topics:
            self.reply(conn, request, Status.NOT_FOUND)
            return
        conn.topics.discard(fields["topic"])
        self.reply(conn, request)

    def publish(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        data = payloads.data_from(fields, request.encoding)
        for other in self.connections:
            if other is not conn and fields["topic"] in other.topics:
                other.deliver(str(conn.identity), "mcast", fields["topic"], data)
        self.reply(conn, request)

    def unicast(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        data = payloads.data_from(fields, request.encoding)
        targets = [c for c in self.connections if c.identity == fields["to"] and not c.closed]
        for target in targets:
            target.deliver(str(conn.identity), "ucast", None, data)
        self.reply(conn, request, Status.OK if targets else Status.NOT_FOUND)

    def broadcast(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        data = payloads.data_from(fields, request.encoding)
        for other in self.connections:  # like SSMP: the peers sharing a topic, once each
            if other is not conn and not other.closed and other.topics & conn.topics:
                other.deliver(str(conn.identity), "bcast", None, data)
        self.reply(conn, request)

    def echo(self, conn: FakeConnection, request: Request) -> None:
        conn.send(Response(request.id, Status.OK, request.encoding, request.payload))

    def delay(self, conn: FakeConnection, request: Request) -> None:
        seconds = payloads.decode_payload(request.payload, request.encoding)["delay"]
        self.thread.reactor.callLater(seconds, self.reply, conn, request, Status.OK, {"late": True})

    def notify_back(self, conn: FakeConnection, request: Request) -> None:
        conn.send(Notify(NOTIFY_BACK, request.encoding, request.payload))
        self.reply(conn, request)

    def status(self, conn: FakeConnection, request: Request) -> None:
        fields = payloads.decode_payload(request.payload, request.encoding)
        self.reply(conn, request, fields["status"], {"why": "asked"})

    @staticmethod
    def not_found(server: FakeSTMPServer, conn: FakeConnection, request: Request) -> None:
        FakeSTMPServer.reply(conn, request, Status.NOT_FOUND)


def renaming_login(server: FakeSTMPServer, conn: FakeConnection, request: Request) -> None:
    """A login behaviour that takes (and answers with) the identity in upper case."""
    fields = payloads.decode_payload(request.payload, request.encoding)
    conn.identity = fields["id"].upper()
    server.reply(conn, request, Status.OK, {"id": conn.identity})


# -- the real broker, for the marked tests --------------------------------------------------------

#: the broker's STMP listeners; ``listening[i]`` is where the i-th one is bound
BROKER_LISTENERS = (
    "stmp=tcp:0:interface=127.0.0.1",
    "stmp-ws=tcp:0:interface=127.0.0.1",
    "stmp=tls:0:interface=127.0.0.1",
    "stmp-ws=tls:0:interface=127.0.0.1",
)
#: the transport of each of :data:`BROKER_LISTENERS`, as the target fixtures' params name it
BROKER_TRANSPORTS = ("tcp", "ws", "tls", "wss")


@frozen
class BrokerTarget:
    """One STMP listener of a real broker, with the attributes of :class:`FakeSTMPServer` that
    the helpers and the marked tests use."""

    thread: ReactorThread
    host: str
    port: int
    ws: bool


Target = FakeSTMPServer | BrokerTarget


def server_tls_context(pki: Any) -> Any:
    """The server side of TLS with the test PKI's server certificate."""
    from msgbroker.tls import server_context_factory

    return server_context_factory(str(pki.server.cert), str(pki.server.key), None)


@contextmanager
def stmp_broker(pki: Any) -> Iterator[RunningBroker]:
    """A broker with :data:`BROKER_LISTENERS`, open login and the test PKI's certificate."""
    with running_broker(
        BROKER_LISTENERS,
        auth=("open",),
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
    ) as running:
        yield running


def broker_target(running: RunningBroker, listener: int) -> BrokerTarget:
    """The ``listener``-th of :data:`BROKER_LISTENERS` as a test target."""
    host, port = parse_address(running.service.broker.listening[listener][1])
    return BrokerTarget(running.thread, host, port, ws="stmp-ws=" in BROKER_LISTENERS[listener])


@contextmanager
def fake_or_broker(
    request: pytest.FixtureRequest, thread: ReactorThread, tls: Any = None
) -> Iterator[Target]:
    """The target a ``target``/``tls_target`` fixture's param names ("fake-ws", "broker-tls"):
    a :class:`FakeSTMPServer` (with the server context ``tls`` for "tls"/"wss"), or that listener
    of the test's ``broker`` fixture, which is only requested then."""
    kind, transport = request.param.split("-")
    if kind == "fake":
        with FakeSTMPServer(thread, ws=transport in ("ws", "wss"), tls=tls) as running:
            yield running
    else:
        broker = request.getfixturevalue("broker")
        yield broker_target(broker, BROKER_TRANSPORTS.index(transport))


def twisted_client(server: Target, **options: Any) -> Any:
    """Connect from the reactor thread (WebSocket if the server is one); the ready protocol."""
    thread = server.thread
    # (not thread.call(connect, ..., **options): thread.call has a timeout argument too)
    return thread.call(
        lambda: connect(thread.reactor, server.host, server.port, ws=server.ws, **options)
    )


def when_handled(thread: Any, proto: Any, predicate: Callable[[], Any]) -> Any:
    """Wait until ``predicate()`` (about the Twisted client's state) holds: checked in the
    reactor thread right after the client handles what its transport delivers (bytes or a
    WebSocket message), so nothing polls."""

    def install() -> Any:
        if predicate():
            return True
        done: defer.Deferred[bool] = defer.Deferred()
        handle = proto._transport_data

        def observed(unit: Any) -> None:
            handle(unit)
            if not done.called and predicate():
                proto._transport_data = handle
                done.callback(True)

        proto._transport_data = observed
        return done

    return thread.call(install)


def blocking_client(server: Target, **options: Any) -> BlockingSTMPClient:
    return BlockingSTMPClient(server.host, server.port, ws=server.ws, **options)


# -- Twisted, on a Clock and a StringTransport --------------------------------------------------


class Wire(MemoryWire):
    """An :class:`STMPClientProtocol` on a StringTransport and a Clock."""

    def __init__(self, **options: Any) -> None:
        clock = Clock()
        proto = STMPClientProtocol(clock=clock, **options)
        super().__init__(proto, clock, BinaryDecoder().feed, encode_binary)

    def ready(self) -> None:
        """Answer the version check."""
        assert self.sent()[0] == Request(0, 0, RAW, b"\x01")
        self.feed(Response(0, Status.OK, RAW, b"\x01"))
