"""The STMP client library (Twisted and blocking, TCP and WebSocket).

Timers (request timeouts, heartbeat) and misbehaving servers are driven with a ``Clock`` and
a ``StringTransport``. Everything that needs real sockets runs against :class:`FakeServer`,
a small STMP server built here on the codec (not the broker): it answers the version check
(or refuses it), logs in anybody, routes publish/unicast/broadcast between its own
connections like the broker's built-in actions (a broadcast reaches the peers sharing a
topic with the sender, as DECISIONS.md says), and has test actions that echo, reply late,
never reply, notify back or answer a chosen status.

Tests marked ``# real broker:`` exercise behaviour the broker implements too: they take the
``target`` (or ``tls_target``) fixture and run against the fake and against a real broker
(``running_broker`` with ``stmp`` and ``stmp-ws`` listeners, plain and TLS, in the shared
reactor thread), over TCP and WebSocket; what only the fake can show (its record of
requests, its test actions) is checked on the fake alone. The rest (timeouts, late replies,
refused versions, silent servers, wire details) need a server that misbehaves on purpose
and stay on the fake.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from attrs import frozen
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, LoopingCall
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.blocking_ws import WebSocketReader, ws_frame, ws_mask
from msgbroker.plugins.stmp.client import (
    BlockingSTMPClient,
    Delivery,
    STMPClientProtocol,
    STMPConnectionClosed,
    STMPError,
    client_tls_options,
    connect,
)
from msgbroker.plugins.stmp.codec import (
    PING,
    BinaryDecoder,
    Encoding,
    Message,
    Notify,
    Ping,
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
from msgbroker.plugins.stmp.common import RequestIds
from msgbroker.plugins.stmp.websocket import ReactorTimer
from tests.ssmp.e2e_support import (
    WAIT,
    Inbox,
    ReactorThread,
    RunningBroker,
    parse_address,
    reactor_thread,
    running_broker,
)

JSON, MSGPACK, RAW = Encoding.JSON, Encoding.MSGPACK, Encoding.RAW
ECHO = parse_action("1.0.0.1")  # reply Ok with the request's encoding and payload
DELAY = parse_action("1.0.0.2")  # {"delay": s}: reply Ok {"late": true} after s seconds
SILENT = parse_action("1.0.0.3")  # never reply
NOTIFY_BACK = parse_action("1.0.0.4")  # notify 1.0.0.4 with the payload, then reply Ok
STATUS = parse_action("1.0.0.5")  # {"status": n}: reply n with {"why": "asked"}


# -- a fake STMP server ------------------------------------------------------------------------


class FakeConnection:
    """One client connection of :class:`FakeServer` (lives in the reactor thread)."""

    def __init__(self, server: FakeServer, write: Callable[..., None], drop: Callable[[], None],
                 text: bool) -> None:  # fmt: skip
        self.server = server
        self.index = len(server.connections)
        self.write = write
        self.drop = drop
        self.text = text
        self.binary_frames = False
        self.identity: str | None = None
        self.encoding = JSON
        self.topics: set[str] = set()
        self.closed = False
        self.pinger: LoopingCall | None = None

    def send(self, message: Message, inline: bool | None = None) -> None:
        if not self.closed:
            self.write(message, inline)

    def received(self, message: Message) -> None:
        self.server.record(self, message)
        if type(message) is Request:
            handler = self.server.behaviour.get(message.action, FakeServer.not_found)
            handler(self.server, self, message)

    def deliver(self, sender: str, kind: str, topic: str | None, data: bytes | None) -> None:
        fields = payloads.delivery_fields(sender, kind, topic, data, self.encoding)
        payload = payloads.encode_payload(fields, self.encoding)
        self.send(Notify(payloads.DELIVERY, self.encoding, payload))

    def lost(self) -> None:
        self.closed = True
        if self.pinger is not None and self.pinger.running:
            self.pinger.stop()
        self.server.record(self, None)


class _FakeTCP(Protocol):
    def connectionMade(self) -> None:
        self.decoder = BinaryDecoder()
        self.conn = self.factory.server.connect(self._write, self._drop, text=False)

    def _write(self, message: Message, inline: bool | None) -> None:
        self.transport.write(encode_binary(message))

    def _drop(self) -> None:
        self.transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        self.factory.server.raw.append(data)
        try:
            for message in self.decoder.feed(data):
                self.conn.received(message)
        except RemoteProtocolError:
            self.transport.abortConnection()

    def connectionLost(self, reason: Any = None) -> None:
        self.conn.lost()


class _FakeWS(WebSocketServerProtocol):
    def onOpen(self) -> None:
        self.decoder = TextDecoder()
        self.conn = self.factory.server.connect(self._write, self._drop, text=True)

    def _write(self, message: Message, inline: bool | None) -> None:
        if self.conn.binary_frames:
            self.sendMessage(encode_binary(message, with_ps=False), isBinary=True)
            return
        text, followup = encode_text(message, inline)
        self.sendMessage(text.encode(), isBinary=False)
        if followup is not None:
            self.sendMessage(followup, isBinary=True)

    def _drop(self) -> None:
        self.sendClose(1000)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.server.frames.append((isBinary, payload))
        try:
            if isBinary:
                if not self.decoder.waiting_for_payload:
                    self.conn.binary_frames = True
                message = self.decoder.binary_frame(payload)
            else:
                message = self.decoder.text_frame(payload.decode())
        except RemoteProtocolError:
            self.dropConnection(abort=True)
            return
        if message is not None:
            self.conn.received(message)

    def connectionLost(self, reason: Any = None) -> None:
        super().connectionLost(reason)
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.lost()


class FakeServer:
    """A fake STMP server on a loopback port in the shared reactor thread: TCP (binary) or
    WebSocket (``ws``: text frames, or binary frames when the client sends those), plain or
    TLS (``tls``: a server context). ``versions`` are the versions it accepts; the reply to
    the version check goes inline in text mode unless ``version_inline=False`` (then as the
    two-frame form, like the broker). ``ping_every`` makes it send heartbeats. ``secret``
    makes login check the credential. Tests may replace entries of ``behaviour``."""

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
        self.thread = thread
        self.ws = ws
        self.tls = tls
        self.versions = versions
        self.version_inline = version_inline
        self.ping_every = ping_every
        self.secret = secret
        self.connections: list[FakeConnection] = []
        #: (connection index, message or None when the connection ended), in order
        self.log: list[tuple[int, Message | None]] = []
        #: what TCP clients sent, as received; WebSocket frames (is_binary, payload)
        self.raw: list[bytes] = []
        self.frames: list[tuple[bool, bytes]] = []
        self.behaviour: dict[int, Callable[[FakeServer, FakeConnection, Request], None]] = {
            0: FakeServer.version_check,
            payloads.LOGIN: FakeServer.login,
            payloads.SUBSCRIBE: FakeServer.subscribe,
            payloads.UNSUBSCRIBE: FakeServer.unsubscribe,
            payloads.PUBLISH: FakeServer.publish,
            payloads.UNICAST: FakeServer.unicast,
            payloads.BROADCAST: FakeServer.broadcast,
            ECHO: FakeServer.echo,
            DELAY: FakeServer.delay,
            SILENT: lambda server, conn, request: None,
            NOTIFY_BACK: FakeServer.notify_back,
            STATUS: FakeServer.status,
        }
        self._changed = threading.Condition()
        self._port: Any = None
        self.host = "127.0.0.1"
        self.port = 0

    # -- running ------------------------------------------------------------------------------

    def __enter__(self) -> FakeServer:
        def listen() -> Any:
            reactor = self.thread.reactor
            if self.ws:
                factory: Any = WebSocketServerFactory(reactor=reactor)
                factory._batched_timer = ReactorTimer(reactor)
                factory.protocol = _FakeWS
            else:
                factory = Factory.forProtocol(_FakeTCP)
            factory.server = self
            if self.tls is not None:  # TLS flushes on our reactor, not the global one
                factory = TLSMemoryBIOFactory(self.tls, False, factory, clock=reactor)
            return reactor.listenTCP(0, factory, interface="127.0.0.1")

        self._port = self.thread.call(listen)
        self.port = self._port.getHost().port
        return self

    def __exit__(self, *exc_info: object) -> None:
        def stop() -> Any:
            for conn in self.connections:
                if not conn.closed:
                    conn.drop()
            return self._port.stopListening()

        self.thread.call(stop)

    def connect(self, write: Callable[..., None], drop: Callable[[], None], text: bool) -> Any:
        conn = FakeConnection(self, write, drop, text)
        self.connections.append(conn)
        if self.ping_every:
            conn.pinger = LoopingCall(conn.send, PING)
            conn.pinger.clock = self.thread.reactor
            conn.pinger.start(self.ping_every, now=False)
        return conn

    def record(self, conn: FakeConnection, message: Message | None) -> None:
        with self._changed:
            self.log.append((conn.index, message))
            self._changed.notify_all()

    def wait(self, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
        """Wait (in the test's thread) until ``predicate()`` is true; its value."""
        with self._changed:
            result = self._changed.wait_for(predicate, timeout)
        assert result, "the fake server did not see what was expected in time"
        return result

    def messages(self, kind: type | None = None, conn: int | None = None) -> list[Any]:
        return [
            m
            for i, m in list(self.log)
            if m is not None and (kind is None or type(m) is kind) and conn in (None, i)
        ]

    def requests(self, action: int) -> list[Request]:
        return [m for m in self.messages(Request) if m.action == action]

    def ended(self, conn: int = 0) -> bool:
        return (conn, None) in self.log

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
    def not_found(server: FakeServer, conn: FakeConnection, request: Request) -> None:
        FakeServer.reply(conn, request, Status.NOT_FOUND)


@pytest.fixture(scope="module")
def thread() -> ReactorThread:
    return reactor_thread()


@pytest.fixture(params=["tcp", "ws"])
def server(request, thread) -> Iterator[FakeServer]:
    with FakeServer(thread, ws=request.param == "ws") as running:
        yield running


@pytest.fixture
def tcp_server(thread) -> Iterator[FakeServer]:
    with FakeServer(thread) as running:
        yield running


@pytest.fixture
def ws_server(thread) -> Iterator[FakeServer]:
    with FakeServer(thread, ws=True) as running:
        yield running


# -- the real broker, for the marked tests --------------------------------------------------------

#: the broker's STMP listeners; ``listening[i]`` is where the i-th one is bound
BROKER_LISTENERS = (
    "stmp=tcp:0:interface=127.0.0.1",
    "stmp-ws=tcp:0:interface=127.0.0.1",
    "stmp=tls:0:interface=127.0.0.1",
    "stmp-ws=tls:0:interface=127.0.0.1",
)


@frozen
class BrokerTarget:
    """One STMP listener of a real broker, with the attributes of :class:`FakeServer` that
    the helpers and the marked tests use."""

    thread: ReactorThread
    host: str
    port: int
    ws: bool


Target = FakeServer | BrokerTarget


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tests.certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def broker(pki) -> Iterator[RunningBroker]:
    """A broker of its own per test (identities and subscriptions do not carry over)."""
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


@pytest.fixture(params=["fake-tcp", "fake-ws", "broker-tcp", "broker-ws"])
def target(request, thread) -> Iterator[Target]:
    """The fake server or the real broker, over TCP or WebSocket."""
    kind, transport = request.param.split("-")
    if kind == "fake":
        with FakeServer(thread, ws=transport == "ws") as running:
            yield running
    else:
        yield broker_target(request.getfixturevalue("broker"), 0 if transport == "tcp" else 1)


@pytest.fixture(params=["fake-tls", "fake-wss", "broker-tls", "broker-wss"])
def tls_target(request, thread, tls_context) -> Iterator[Target]:
    """The fake server or the real broker, over TLS or WebSocket over TLS (wss)."""
    kind, transport = request.param.split("-")
    if kind == "fake":
        with FakeServer(thread, ws=transport == "wss", tls=tls_context) as running:
            yield running
    else:
        yield broker_target(request.getfixturevalue("broker"), 2 if transport == "tls" else 3)


def twisted_client(server: Target, **options: Any) -> Any:
    """Connect from the reactor thread (WebSocket if the server is one); the ready protocol."""
    thread = server.thread
    # (not thread.call(connect, ..., **options): thread.call has a timeout argument too)
    return thread.call(
        lambda: connect(thread.reactor, server.host, server.port, ws=server.ws, **options)
    )


def when_handled(thread: Any, proto: Any, predicate: Callable[[], Any]) -> Any:
    """Wait until ``predicate()`` (about the Twisted client's state) holds: checked in the
    reactor thread right after the client handles each message, so nothing polls."""

    def install() -> Any:
        if predicate():
            return True
        done: defer.Deferred[bool] = defer.Deferred()
        handle = proto._stmp_received

        def observed(message: Any) -> None:
            handle(message)
            if not done.called and predicate():
                proto._stmp_received = handle
                done.callback(True)

        proto._stmp_received = observed
        return done

    return thread.call(install)


def blocking_client(server: Target, **options: Any) -> BlockingSTMPClient:
    return BlockingSTMPClient(server.host, server.port, ws=server.ws, **options)


# -- Twisted, on a Clock and a StringTransport --------------------------------------------------


class Wire:
    """An :class:`STMPClientProtocol` on a StringTransport and a Clock."""

    def __init__(self, **options: Any) -> None:
        self.clock = Clock()
        self.proto = STMPClientProtocol(clock=self.clock, **options)
        self.transport = StringTransport()
        self.proto.makeConnection(self.transport)
        self._decoder = BinaryDecoder()

    def sent(self) -> list[Message]:
        """What the client wrote since the last call."""
        data = self.transport.value()
        self.transport.clear()
        return list(self._decoder.feed(data))

    def feed(self, *messages: Message) -> None:
        self.proto.dataReceived(b"".join(encode_binary(m) for m in messages))

    def ready(self) -> None:
        """Answer the version check."""
        assert self.sent()[0] == Request(0, 0, RAW, b"\x01")
        self.feed(Response(0, Status.OK, RAW, b"\x01"))

    def lose(self) -> None:
        self.proto.connectionLost(Failure(ConnectionDone("gone")))

    @property
    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


def result(d: defer.Deferred[Any]) -> Any:
    """The result of a Deferred that has fired (raising its failure)."""
    box: list[Any] = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    if isinstance(box[0], Failure):
        box[0].raiseException()
    return box[0]


def test_the_version_check_is_sent_first_and_ready_fires_with_the_version():
    wire = Wire()
    ready = wire.proto.when_ready()
    assert wire.sent() == [Request(0, 0, RAW, b"\x01")]  # id 0, action 0, raw, [0.1]
    assert not ready.called
    wire.feed(Response(0, Status.OK, RAW, b"\x01"))
    assert result(ready) == (0, 1)
    assert wire.proto.stmp_version == (0, 1)
    assert result(wire.proto.when_ready()) == (0, 1)


def test_requests_made_before_the_version_reply_are_pipelined_after_the_check():
    wire = Wire()
    d = wire.proto.request(ECHO, {"a": 1})
    sent = wire.sent()
    assert [type(m) for m in sent] == [Request, Request]
    assert sent[0].action == 0 and sent[1] == Request(1, ECHO, JSON, b'{"a":1}')
    wire.feed(Response(0, Status.OK, RAW, b"\x01"), Response(1, Status.OK, JSON, b"[]"))
    assert result(d) == Response(1, Status.OK, JSON, b"[]")


def test_version_not_supported_fails_ready_with_0x35_and_closes():
    wire = Wire()
    pending = wire.proto.request(ECHO, None)
    wire.feed(Response(0, Status.VERSION_NOT_SUPPORTED))
    with pytest.raises(STMPError) as info:
        result(wire.proto.when_ready())
    assert info.value.status == 0x35
    assert "VersionNotSupported" in str(info.value)
    assert wire.closed
    with pytest.raises(STMPConnectionClosed):
        result(pending)


def test_an_ok_with_a_version_not_offered_closes_the_connection():
    wire = Wire()
    wire.feed(Response(0, Status.OK, RAW, b"\x20"))  # 2.0
    with pytest.raises(RemoteProtocolError):
        result(wire.proto.when_ready())
    assert wire.closed


def test_an_unanswered_version_check_times_out_locally_with_0x25():
    wire = Wire(timeout=5)
    ready = wire.proto.when_ready()
    wire.clock.advance(5)
    with pytest.raises(STMPError) as info:
        result(ready)
    assert info.value.status == 0x25 and info.value.local
    assert wire.closed


def test_request_ids_count_from_1_and_replies_match_by_id_in_any_order():
    wire = Wire()
    wire.ready()
    first, second, third = (wire.proto.request(ECHO, n) for n in (1, 2, 3))
    assert [m.id for m in wire.sent()] == [1, 2, 3]
    wire.feed(
        Response(3, Status.OK, JSON, b"3"),
        Response(1, Status.OK, JSON, b"1"),
        Response(2, Status.NOT_FOUND),
    )
    assert result(first).payload == b"1"
    assert result(second) == Response(2, Status.NOT_FOUND)  # a status is not an error here
    assert result(third).payload == b"3"


def test_request_ids_wrap_from_65535_to_1_and_skip_ids_still_pending():
    wire = Wire()
    wire.ready()
    pending = wire.proto.request(SILENT, None)  # id 1, never answered yet
    wire.proto._ids._next = 65534
    for _ in range(3):
        wire.proto.request(ECHO, None)
    assert [m.id for m in wire.sent()] == [1, 65534, 65535, 2]  # not 0, not 1 (pending)
    assert not pending.called


def test_the_id_allocator_alone():
    ids = RequestIds()
    assert [ids.take(()) for _ in range(3)] == [1, 2, 3]
    ids._next = 65535
    assert ids.take({1, 2}) == 65535
    assert ids.take({1, 2}) == 3
    with pytest.raises(STMPError) as info:
        ids.take(range(1, 65536))
    assert info.value.status == Status.TOO_MANY_REQUESTS


def test_a_request_without_reply_fires_with_a_local_0x25_and_the_late_reply_is_dropped():
    wire = Wire(timeout=10)
    wire.ready()
    d = wire.proto.request(SILENT, {"x": 1}, timeout=2)
    [sent] = wire.sent()
    wire.clock.advance(1.9)
    assert not d.called
    wire.clock.advance(0.1)
    assert result(d) == Response(sent.id, Status.REQUEST_TIMEOUT)
    wire.feed(Response(sent.id, Status.OK, JSON, b'"late"'))  # no error, no effect
    assert wire.proto.late_replies == 1
    assert not wire.closed


def test_call_reports_a_timeout_as_a_local_stmp_error():
    wire = Wire(timeout=3)
    wire.ready()
    d = wire.proto.call(SILENT)
    wire.clock.advance(3)
    with pytest.raises(STMPError) as info:
        result(d)
    assert info.value.status == 0x25 and info.value.local
    assert "no reply in time" in str(info.value)


def test_a_server_sent_0x25_is_not_local():
    wire = Wire()
    wire.ready()
    d = wire.proto.call(ECHO)
    wire.feed(Response(1, Status.REQUEST_TIMEOUT))
    with pytest.raises(STMPError) as info:
        result(d)
    assert info.value.status == 0x25 and not info.value.local


def test_a_timed_out_id_is_not_reused_before_its_late_reply_came():
    wire = Wire()
    wire.ready()
    wire.proto.request(SILENT, timeout=1)
    wire.clock.advance(1)
    wire.proto._ids._next = 1  # as after a wrap
    wire.proto.request(ECHO)
    assert [m.id for m in wire.sent()] == [1, 2]  # 2, not the timed-out 1
    wire.feed(Response(1, Status.OK))  # the late reply: dropped, and 1 is free again
    wire.proto._ids._next = 1
    wire.proto.request(ECHO)
    assert [m.id for m in wire.sent()] == [1]


def test_a_reply_to_no_request_is_ignored():
    wire = Wire()
    wire.ready()
    wire.feed(Response(77, Status.OK))
    assert not wire.closed and wire.proto.late_replies == 0


def test_heartbeat_pings_every_interval_and_closes_after_two_silent_intervals():
    wire = Wire(heartbeat=30)
    wire.ready()
    wire.clock.advance(29)
    assert wire.sent() == []
    wire.clock.advance(1)
    assert wire.sent() == [PING]
    wire.clock.advance(20)
    wire.feed(PING)  # the server's heartbeat at t=50 keeps us alive
    assert wire.proto.pings_received == 1
    wire.clock.advance(10)
    assert wire.sent() == [PING]  # t=60
    wire.clock.advance(30)
    assert wire.sent() == [PING]  # t=90: 40 s of silence so far
    assert not wire.closed
    ready_to_fail = wire.proto.request(SILENT, timeout=100)
    wire.clock.advance(20)  # t=110: 60 s since the server's ping
    assert wire.closed
    wire.lose()
    with pytest.raises(STMPConnectionClosed, match="nothing from the server for 60 s"):
        result(ready_to_fail)


def test_heartbeat_off():
    wire = Wire(heartbeat=None)
    wire.ready()
    wire.clock.advance(1000)
    assert wire.sent() == [] and not wire.closed


@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_deliveries_go_to_on_delivery_and_other_notifies_to_on_notify(encoding):
    deliveries, notifies = [], []
    wire = Wire(on_delivery=deliveries.append, on_notify=notifies.append)
    wire.ready()

    def notify(sender, kind, topic, data):
        fields = payloads.delivery_fields(sender, kind, topic, data, encoding)
        return Notify(payloads.DELIVERY, encoding, payloads.encode_payload(fields, encoding))

    wire.feed(
        notify("alice", "mcast", "news", b"a|b"),
        notify("bob", "ucast", None, b"\xff\x00"),
        notify("carol", "bcast", None, b""),
        notify("dave", "subscribe", "news", None),
        Notify(payloads.DELIVERY, JSON, b"{not json"),  # malformed: dropped
        Notify(payloads.DELIVERY, JSON, b'{"from": "x", "kind": "zap"}'),  # dropped
        Notify(NOTIFY_BACK, RAW, b"plugin"),
    )
    assert deliveries == [
        Delivery("alice", "mcast", "news", b"a|b"),
        Delivery("bob", "ucast", None, b"\xff\x00"),
        Delivery("carol", "bcast", None, b""),
        Delivery("dave", "subscribe", "news", b""),
    ]
    assert notifies == [Notify(NOTIFY_BACK, RAW, b"plugin")]
    assert not wire.closed


def test_a_failing_event_handler_is_logged_not_fatal():
    def boom(delivery):
        raise RuntimeError("handler bug")

    wire = Wire(on_delivery=boom)
    wire.ready()
    fields = payloads.delivery_fields("a", "bcast", None, b"x", JSON)
    wire.feed(Notify(payloads.DELIVERY, JSON, payloads.encode_payload(fields, JSON)))
    d = wire.proto.request(ECHO)
    wire.feed(Response(1, Status.OK))
    assert result(d).status == 0
    assert not wire.closed


@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_broker_actions_send_the_decisions_payloads(encoding):
    wire = Wire(encoding=encoding)
    wire.ready()
    wire.proto.login("alice", "secret", b"pw")
    wire.proto.subscribe("news", presence=True)
    wire.proto.unsubscribe("news")
    wire.proto.publish("news", b"text | pipe")
    wire.proto.unicast("bob", b"\xff\xfe")
    wire.proto.broadcast(b"all")
    sent = wire.sent()
    assert [codec_action(m) for m in sent] == [f"0.0.1.{n}" for n in (1, 2, 3, 4, 5, 6)]
    assert all(m.encoding == encoding for m in sent)
    values = [payloads.decode_payload(m.payload, encoding) for m in sent]
    binary = {"data_b64": "//4="} if encoding == JSON else {"data": b"\xff\xfe"}
    text = (lambda s: s) if encoding == JSON else (lambda s: s.encode())
    assert values == [
        {"id": "alice", "scheme": "secret", "credential": "pw"},
        {"topic": "news", "presence": True},
        {"topic": "news"},
        {"topic": "news", "data": text("text | pipe")},
        {"to": "bob", **binary},
        {"data": text("all")},
    ]


def codec_action(message: Request) -> str:
    from msgbroker.plugins.stmp.codec import action_to_str

    return action_to_str(message.action)


def test_broker_actions_fire_with_none_on_ok_and_fail_with_the_status_and_payload():
    wire = Wire()
    wire.ready()
    login = wire.proto.login("alice", "open")
    sub = wire.proto.subscribe("t")
    wire.feed(
        Response(1, Status.UNAUTHORIZED, JSON, b'{"schemes":["secret"]}'),
        Response(2, Status.OK),
    )
    with pytest.raises(STMPError) as info:
        result(login)
    assert info.value.status == 0x21
    assert info.value.payload == {"schemes": ["secret"]}
    assert str(info.value) == '0x21 Unauthorized: {"schemes": ["secret"]}'
    assert wire.proto.identity is None
    assert result(sub) is None


def test_request_payload_forms():
    wire = Wire(encoding=MSGPACK)
    wire.ready()
    wire.proto.request("10.0.0.1")  # no payload: encoding 0
    wire.proto.request("10.0.0.1", b"\x00raw")  # bytes: raw
    wire.proto.request("10.0.0.1", b"\x08\x01", encoding=Encoding.PROTOBUF)
    wire.proto.request(0x0A000001, {"k": b"v"})  # a value: the protocol's encoding
    wire.proto.request("10.0.0.1", ["x"], encoding=JSON)
    assert wire.sent() == [
        Request(1, 0x0A000001, Encoding.NONE, b""),
        Request(2, 0x0A000001, RAW, b"\x00raw"),
        Request(3, 0x0A000001, Encoding.PROTOBUF, b"\x08\x01"),
        Request(4, 0x0A000001, MSGPACK, msgpack.packb({"k": b"v"})),
        Request(5, 0x0A000001, JSON, b'["x"]'),
    ]
    with pytest.raises(ValueError):
        wire.proto.request("10.0.0", None)
    with pytest.raises(ValueError):
        wire.proto.request("10.0.0.1", {"bytes": b"x"}, encoding=JSON)
    assert wire.sent() == []


def test_a_request_from_the_server_is_answered_not_found():
    wire = Wire()
    wire.ready()
    wire.feed(Request(9, ECHO, JSON, b"{}"))
    assert wire.sent() == [Response(9, Status.NOT_FOUND)]


def test_garbage_from_the_server_closes_and_fails_what_is_pending():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(ECHO)
    wire.proto.dataReceived(b"\x07")  # reserved header bits
    assert wire.closed
    with pytest.raises(STMPConnectionClosed, match="protocol error"):
        result(d)


def test_connection_loss_fails_pending_requests_and_fires_when_closed():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(ECHO)
    closed = wire.proto.when_closed()
    wire.lose()
    with pytest.raises(STMPConnectionClosed):
        result(d)
    assert isinstance(result(closed), STMPConnectionClosed)
    with pytest.raises(STMPConnectionClosed):
        result(wire.proto.request(ECHO))
    assert wire.clock.getDelayedCalls() == []  # heartbeat and request timers cancelled


def test_close_fails_pending_requests_and_stops_the_timers():
    wire = Wire()
    wire.ready()
    d = wire.proto.request(SILENT)
    closing = wire.proto.close()
    assert wire.closed and not closing.called
    with pytest.raises(STMPConnectionClosed):
        result(wire.proto.request(ECHO))
    wire.lose()
    assert result(closing) is None
    with pytest.raises(STMPConnectionClosed, match="closed by the client"):
        result(d)
    assert wire.clock.getDelayedCalls() == []


# -- Twisted, on real sockets --------------------------------------------------------------------


# real broker: login, subscribe, publish and the delivery, over TCP and WebSocket
def test_twisted_publish_reaches_a_subscriber(target):
    inbox = Inbox()
    bob = twisted_client(target, identity="bob", on_delivery=inbox)
    alice = twisted_client(target, identity="alice")
    assert (bob.identity, bob.stmp_version) == ("bob", (0, 1))
    assert target.thread.call(bob.subscribe, "news") is None
    assert target.thread.call(alice.publish, "news", b"hello | world") is None
    assert target.thread.call(inbox.get) == Delivery("alice", "mcast", "news", b"hello | world")
    target.thread.call(alice.close)
    target.thread.call(bob.close)


# real broker: binary data both ways, JSON (data_b64) and msgpack (bytes)
@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_twisted_binary_data_round_trips(target, encoding):
    inbox = Inbox()
    bob = twisted_client(target, identity="bob", on_delivery=inbox, encoding=encoding)
    alice = twisted_client(target, identity="alice", encoding=encoding)
    data = bytes(range(256)) * 4 + b"|\x00|"
    target.thread.call(bob.subscribe, "bin")
    target.thread.call(alice.subscribe, "bin")  # a broadcast reaches peers sharing a topic
    target.thread.call(alice.publish, "bin", data)
    assert target.thread.call(inbox.get).data == data
    target.thread.call(alice.unicast, "bob", b"\xff")
    assert target.thread.call(inbox.get) == Delivery("alice", "ucast", None, b"\xff")
    target.thread.call(alice.broadcast, b"\x00")
    assert target.thread.call(inbox.get) == Delivery("alice", "bcast", None, b"\x00")
    target.thread.call(alice.close)
    target.thread.call(bob.close)


# real broker: unicast to nobody is 0x24
def test_twisted_unicast_to_nobody_fails_with_not_found(target):
    alice = twisted_client(target, identity="alice")
    with pytest.raises(STMPError) as info:
        target.thread.call(alice.unicast, "nobody", b"x")
    assert info.value.status == Status.NOT_FOUND
    target.thread.call(alice.close)


def test_twisted_timeout_and_late_reply_on_a_real_connection(server):
    proto = twisted_client(server, identity="alice", timeout=0.2)
    response = server.thread.call(proto.request, DELAY, {"delay": 0.6})
    assert response.status == Status.REQUEST_TIMEOUT
    when_handled(server.thread, proto, lambda: proto.late_replies == 1)
    assert server.thread.call(proto.request, ECHO, [1]).payload == b"[1]"  # still usable


def test_twisted_version_refused_over_the_network(thread, server):
    server.versions = ((0, 2),)
    with pytest.raises(STMPError) as info:
        twisted_client(server, identity="alice")
    assert info.value.status == Status.VERSION_NOT_SUPPORTED
    assert server.wait(lambda: server.ended(0))
    assert server.requests(payloads.LOGIN) == []  # never got that far


def test_twisted_notify_back_reaches_on_notify(server):
    inbox = Inbox()
    proto = twisted_client(server, identity="alice", on_notify=inbox)
    server.thread.call(proto.call, NOTIFY_BACK, {"n": 1})
    notify = server.thread.call(inbox.get)
    assert notify.action == NOTIFY_BACK and json.loads(notify.payload) == {"n": 1}


def test_twisted_ws_text_wire_format(ws_server):
    proto = twisted_client(ws_server, identity="alice")
    server = ws_server
    assert server.frames[0] == (False, b"1|5|0|0|01")  # version check, hex list inline
    server.thread.call(proto.request, ECHO, "a|b||c")
    assert (False, b'1|2|2|16777217|"a|b||c"') in server.frames  # JSON inline, | kept
    reply = server.thread.call(proto.request, ECHO, b"\x00\xff|", encoding=RAW)
    assert reply.payload == b"\x00\xff|"
    header = b"1|5|3|16777217"  # raw: the two-frame form
    index = server.frames.index((False, header))
    assert server.frames[index + 1] == (True, b"\x00\xff|")


def test_twisted_ws_msgpack_travels_in_two_frames_both_ways(ws_server):
    inbox = Inbox()
    bob = twisted_client(ws_server, identity="bob", encoding=MSGPACK, on_delivery=inbox)
    alice = twisted_client(ws_server, identity="alice", encoding=MSGPACK)
    ws_server.thread.call(bob.subscribe, "t")
    ws_server.thread.call(alice.publish, "t", b"\x00\x01")
    assert ws_server.thread.call(inbox.get) == Delivery("alice", "mcast", "t", b"\x00\x01")
    publish = [f for f in ws_server.frames if f[1].startswith(b"1|3|")]
    assert publish and all(b"|" not in f[1].split(b"|", 4)[-1] for f in publish)


def test_twisted_ws_version_reply_in_two_frames_is_accepted(thread):
    with FakeServer(thread, ws=True, version_inline=False) as server:
        proto = twisted_client(server, identity="alice")
        assert proto.stmp_version == (0, 1)


def test_twisted_ws_binary_frames(ws_server):
    proto = twisted_client(ws_server, identity="alice", binary_frames=True)
    version_frame = ws_server.frames[0]
    assert version_frame == (True, encode_binary(Request(0, 0, RAW, b"\x01"), with_ps=False))
    assert ws_server.thread.call(proto.request, ECHO, {"k": "|"}).payload == b'{"k":"|"}'


def test_twisted_heartbeat_on_a_real_connection(thread):
    with FakeServer(thread, ping_every=0.1) as server:
        proto = twisted_client(server, identity="alice", heartbeat=0.1)
        server.wait(lambda: len(server.messages(Ping)) >= 2)  # the client pings
        # ... and hears the server's
        when_handled(server.thread, proto, lambda: proto.pings_received >= 2)


def test_twisted_gives_up_on_a_silent_server(thread):
    with FakeServer(thread) as server:
        proto = twisted_client(server, identity="alice", heartbeat=0.1)
        reason = thread.call(proto.when_closed)
        assert "nothing from the server" in str(reason)


@pytest.fixture
def tls_context(pki):
    from msgbroker.tls import server_context_factory

    return server_context_factory(str(pki.server.cert), str(pki.server.key), None)


# real broker: tls and wss listeners
def test_twisted_over_tls(pki, tls_target):
    thread, port, ws = tls_target.thread, tls_target.port, tls_target.ws
    tls = client_tls_options("127.0.0.1", ca=str(pki.ca.cert_path))

    def connect_as(identity: str, **options: Any) -> Any:
        return thread.call(
            lambda: connect(
                thread.reactor, "127.0.0.1", port, ws=ws, tls=tls, identity=identity, **options
            )
        )

    inbox = Inbox()
    bob = connect_as("bob", on_delivery=inbox)
    alice = connect_as("alice")
    thread.call(bob.subscribe, "secure")
    thread.call(alice.publish, "secure", b"over tls")
    assert thread.call(inbox.get) == Delivery("alice", "mcast", "secure", b"over tls")
    if isinstance(tls_target, FakeServer):  # the echo action is the fake's
        assert thread.call(alice.request, ECHO, "over tls").payload == b'"over tls"'
    thread.call(alice.close)
    thread.call(bob.close)


# -- blocking ------------------------------------------------------------------------------------


# real broker: the blocking client's broker actions and deliveries
@pytest.mark.parametrize("encoding", [JSON, MSGPACK])
def test_blocking_publish_unicast_broadcast(target, encoding):
    with blocking_client(target, identity="bob", encoding=encoding) as bob, \
            blocking_client(target, identity="alice", encoding=encoding) as alice:  # fmt: skip
        assert bob.stmp_version == (0, 1) and bob.identity == "bob"
        bob.subscribe("news")
        alice.broadcast(b"no shared topic yet")  # Ok, and reaches nobody (else bob's first)
        alice.subscribe("news")
        alice.publish("news", b"a | b")
        alice.publish("news", b"\xff\x00")
        alice.unicast("bob", b"u")
        alice.broadcast(b"b")
        got = [bob.next_delivery(WAIT) for _ in range(4)]
        assert got == [
            Delivery("alice", "mcast", "news", b"a | b"),
            Delivery("alice", "mcast", "news", b"\xff\x00"),
            Delivery("alice", "ucast", None, b"u"),
            Delivery("alice", "bcast", None, b"b"),
        ]
        assert bob.next_delivery(0) is None
        with pytest.raises(STMPError) as info:
            alice.unicast("nobody", b"x")
        assert info.value.status == Status.NOT_FOUND
        bob.unsubscribe("news")
        with pytest.raises(STMPError):
            bob.unsubscribe("news")


def test_blocking_call_and_request(server):
    with blocking_client(server, identity="alice") as client:
        assert client.call(ECHO, {"x": [1, "|"]}) == {"x": [1, "|"]}
        assert client.request("1.0.0.1", b"\x00|\xff").payload == b"\x00|\xff"
        with pytest.raises(STMPError) as info:
            client.call(STATUS, {"status": 0x99})
        assert info.value.status == 0x99 and info.value.payload == {"why": "asked"}
        assert str(info.value) == '0x99 status 0x99: {"why": "asked"}'
        assert client.request("9.9.9.9").status == Status.NOT_FOUND


def test_blocking_timeout_is_a_local_0x25_and_the_late_reply_is_dropped(server):
    with blocking_client(server, identity="alice") as client:
        started = time.monotonic()
        response = client.request(DELAY, {"delay": 0.5}, timeout=0.2)
        assert response.status == Status.REQUEST_TIMEOUT and response.payload == b""
        assert time.monotonic() - started < 0.5
        with pytest.raises(STMPError) as info:
            client.call(SILENT, timeout=0.5)  # the late reply arrives while waiting
        assert info.value.local
        assert client.late_replies == 1
        assert client.call(ECHO, 5) == 5  # ids moved on; the connection is fine


def test_blocking_version_refused(thread, server):
    server.versions = ((1, 0),)
    with pytest.raises(STMPError) as info:
        blocking_client(server, identity="alice")
    assert info.value.status == Status.VERSION_NOT_SUPPORTED
    assert server.requests(payloads.LOGIN) == []


def test_blocking_login_refused(thread):
    with FakeServer(thread, secret="pw") as server:
        with pytest.raises(STMPError) as info:
            blocking_client(server, identity="alice", scheme="secret", credential=b"wrong")
        assert info.value.payload == {"schemes": ["secret"]}
        with blocking_client(server, identity="alice", scheme="secret", credential="pw") as ok:
            assert ok.identity == "alice"


def test_blocking_without_identity_only_checks_the_version(server):
    with blocking_client(server) as client:
        assert client.identity is None and client.stmp_version == (0, 1)
        client.login("later")
        assert client.identity == "later"
    assert server.requests(payloads.LOGIN)[0].payload == b'{"id":"later","scheme":"open"}'


def test_blocking_notifies_are_queued_apart_from_deliveries(server):
    with blocking_client(server, identity="alice") as client:
        client.call(NOTIFY_BACK, "n")
        assert client.next_delivery(0) is None
        assert client.next_notify(WAIT) == Notify(NOTIFY_BACK, JSON, b'"n"')


def test_blocking_heartbeat(thread):
    with FakeServer(thread, ping_every=0.1) as server:
        with blocking_client(server, identity="alice", heartbeat=0.1) as client:
            assert client.next_delivery(0.5) is None
            assert client.pings_received >= 2
            server.wait(lambda: len(server.messages(Ping)) >= 2)


def test_blocking_gives_up_on_a_silent_server(server):
    with blocking_client(server, identity="alice", heartbeat=0.1) as client:
        started = time.monotonic()
        with pytest.raises(STMPConnectionClosed, match="nothing from the broker"):
            client.next_delivery(5)
        assert time.monotonic() - started < 2


def test_blocking_poll_keeps_the_heartbeat_without_waiting(tcp_server):
    now = [1000.0]
    with blocking_client(
        tcp_server, identity="alice", heartbeat=30, clock=lambda: now[0]
    ) as client:
        client.poll()
        client.subscribe("after-the-first-poll")  # anything sent before it has arrived
        assert tcp_server.messages(Ping) == []  # no interval had passed
        now[0] += 30.5  # one heartbeat interval, with nothing received
        client.poll()
        tcp_server.wait(lambda: len(tcp_server.messages(Ping)) >= 1)


def test_blocking_server_closing_is_connection_closed(server):
    client = blocking_client(server, identity="alice")
    server.thread.call(server.connections[0].drop)
    with pytest.raises(STMPConnectionClosed):
        client.next_delivery(WAIT)
    with pytest.raises(STMPConnectionClosed):
        client.publish("t", b"x")
    client.close()  # never raises


def test_blocking_ws_wire_format(ws_server):
    with blocking_client(ws_server, identity="alice", encoding=MSGPACK) as client:
        assert ws_server.frames[0] == (False, b"1|5|0|0|01")
        client.call(ECHO, "x|y", encoding=JSON)
        assert (False, b'1|2|2|16777217|"x|y"') in ws_server.frames
        client.publish("t", b"\x00")  # msgpack: header, then the payload frame
        header = next(f for f in ws_server.frames if f[1].startswith(b"1|3|3|"))
        after = ws_server.frames[ws_server.frames.index(header) + 1]
        assert header == (False, b"1|3|3|260") and after[0] is True
        assert msgpack.unpackb(after[1]) == {"topic": "t", "data": b"\x00"}


def test_blocking_ws_version_reply_in_two_frames_is_accepted(thread):
    with FakeServer(thread, ws=True, version_inline=False) as server:
        with blocking_client(server, identity="alice") as client:
            assert client.stmp_version == (0, 1)


def test_blocking_ws_binary_frames(ws_server):
    with blocking_client(ws_server, identity="alice", binary_frames=True) as client:
        assert client.call(ECHO, {"k": "|"}) == {"k": "|"}
        assert ws_server.frames[0] == (True, encode_binary(Request(0, 0, RAW, b"\x01"), False))


def test_blocking_ws_close_is_a_clean_close_handshake(ws_server):
    client = blocking_client(ws_server, identity="alice")
    client.close()
    assert ws_server.wait(lambda: ws_server.ended(0))
    assert client.closed


@pytest.mark.parametrize("ws", [False, True], ids=["tls", "wss"])
def test_blocking_over_tls(thread, pki, tls_context, ws):
    import ssl

    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with FakeServer(thread, ws=ws, tls=tls_context) as server:
        with BlockingSTMPClient("127.0.0.1", server.port, "al", ws=ws, ssl_context=context) as c:
            assert c.call(ECHO, "over tls") == "over tls"


def test_blocking_refused_connection():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        BlockingSTMPClient("127.0.0.1", port, "alice")


def test_blocking_ws_handshake_refused(tcp_server):
    # a TCP STMP server does not speak HTTP: it sees garbage and drops us
    with pytest.raises((STMPConnectionClosed, OSError)):
        BlockingSTMPClient("127.0.0.1", tcp_server.port, "alice", ws=True, timeout=3)


# -- the blocking client's WebSocket pieces ----------------------------------------------------


def server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        return head + bytes([n]) + payload
    if n < 65536:
        return head + b"\x7e" + n.to_bytes(2, "big") + payload
    return head + b"\x7f" + n.to_bytes(8, "big") + payload


def test_ws_mask_is_its_own_inverse_and_matches_the_rfc_example():
    # RFC 6455 5.7: "Hello" masked with 37 fa 21 3d
    key = bytes.fromhex("37fa213d")
    assert ws_mask(b"Hello", key) == bytes.fromhex("7f9f4d5158")
    assert ws_mask(ws_mask(b"x" * 1001, key), key) == b"x" * 1001
    assert ws_frame(1, b"Hello", key) == bytes.fromhex("818537fa213d7f9f4d5158")


def test_ws_frame_lengths():
    for n, head in ((125, 2), (126, 4), (65535, 4), (65536, 10)):
        frame = ws_frame(2, b"\x00" * n)
        assert len(frame) == head + 4 + n


def test_ws_reader_joins_fragments_split_anywhere():
    stream = (
        server_frame(1, b"1|2|", fin=False)
        + server_frame(9, b"ping!")  # a control frame between fragments
        + server_frame(0, b"3|4", fin=True)
        + server_frame(2, b"\x00" * 70000)
    )
    for step in (1, 7, len(stream)):
        reader = WebSocketReader(1 << 20)
        out = []
        for i in range(0, len(stream), step):
            out.extend(reader.feed(stream[i : i + step]))
        assert out == [("ping", b"ping!"), (False, b"1|2|3|4"), (True, b"\x00" * 70000)]


@pytest.mark.parametrize(
    "frame",
    [
        bytes([0x81, 0x81]) + b"mask" + b"x",  # masked by the server
        bytes([0xC1, 0x01]) + b"x",  # RSV1 without an extension
        server_frame(9, b"x" * 126),  # control frame too long
        server_frame(8, b"", fin=False),  # fragmented control frame
        server_frame(0, b"x"),  # continuation of nothing
        server_frame(1, b"\xff"),  # text that is not UTF-8
        server_frame(2, b"x" * 101),  # over the limit
        server_frame(3, b""),  # unknown opcode
        server_frame(1, b"a", fin=False) + server_frame(1, b"b"),  # new message mid-message
    ],
)
def test_ws_reader_rejects_protocol_errors(frame):
    reader = WebSocketReader(100)
    with pytest.raises(RemoteProtocolError):
        list(reader.feed(frame))


# -- connect() helpers ---------------------------------------------------------------------------


def test_connect_defaults_to_4445_and_4446_for_websocket(thread, monkeypatch):
    from msgbroker.plugins.stmp import client as client_module

    seen = []

    class Endpoint:
        def __init__(self, reactor, host, port, timeout):
            seen.append((host, port))

        def connect(self, factory):
            return defer.fail(ConnectionRefusedError())

    monkeypatch.setattr(client_module, "HostnameEndpoint", Endpoint)
    for ws in (False, True):
        with pytest.raises(ConnectionRefusedError):
            thread.call(connect, thread.reactor, "127.0.0.1", ws=ws)
    assert seen == [("127.0.0.1", 4445), ("127.0.0.1", 4446)]

    def create_connection(address, timeout):
        seen.append(address)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", create_connection)
    for ws in (False, True):
        with pytest.raises(ConnectionRefusedError):
            BlockingSTMPClient("127.0.0.1", ws=ws)
    assert seen[2:] == [("127.0.0.1", 4445), ("127.0.0.1", 4446)]


def test_twisted_ws_handshake_failure_fails_the_connect(tcp_server):
    # a TCP STMP server does not speak HTTP: it sees garbage and drops us
    thread = tcp_server.thread
    with pytest.raises(STMPConnectionClosed):
        thread.call(lambda: connect(thread.reactor, "127.0.0.1", tcp_server.port, ws=True))


def test_twisted_connection_dropped_before_the_version_reply(thread, tcp_server):
    tcp_server.behaviour[0] = lambda server, conn, request: conn.drop()
    with pytest.raises(STMPConnectionClosed):
        twisted_client(tcp_server, identity="alice")


def test_a_login_answered_with_another_identity_takes_that_identity():
    wire = Wire()
    wire.ready()
    login = wire.proto.login("alice", "open")
    wire.feed(Response(1, Status.OK, JSON, b'{"id":"ALICE"}'))
    assert result(login) is None
    assert wire.proto.identity == "ALICE"


def renaming_login(server: FakeServer, conn: FakeConnection, request: Request) -> None:
    fields = payloads.decode_payload(request.payload, request.encoding)
    conn.identity = fields["id"].upper()
    server.reply(conn, request, Status.OK, {"id": conn.identity})


def test_blocking_login_answered_with_another_identity_takes_that_identity(thread):
    with FakeServer(thread) as server:
        server.behaviour[payloads.LOGIN] = renaming_login
        with blocking_client(server, identity="alice") as client:
            assert client.identity == "ALICE"
