"""Shared infrastructure of the Micromessage2 client tests (``test_client_*.py``).

Timers and windows of the Twisted protocol are driven with a ``Clock`` and a
``StringTransport`` (:class:`Wire`, playing the server by hand with the codec). Everything
on real sockets runs against :class:`FakeMM2Server`, a small Micromessage2 server built here on
the codec (not the broker), in the session-wide reactor thread
(:func:`tests.ssmp.e2e_support.reactor_thread`): it answers the handshake as configured
(or refuses it with an ERROR frame), checks step 3 with the codec's ``check_confirm``,
routes MESSAGE frames to subscribers (filters and ``@identity`` unicasts included), keeps
each connection's ack window as the sender, and acknowledges what it receives at once
unless told to hold its acks.

Tests marked ``# real broker:`` exercise what the broker implements too: they take the
``target`` fixture and run against the fake and against a real broker (:func:`mm2_broker`,
an ``mm2`` listener and open login, in the same reactor thread; a fresh one per test, so
identities and subscriptions never carry over). What only the fake can show (the frames it
received, its view of a window) is checked on the fake alone; on the broker, the tests look
at its connection (:func:`broker_connection`). Subscriptions are known to be in force after
:func:`settle`'s round trip, on either target. The rest (refused handshakes, held acks,
ERROR frames on demand, vendor extensions) needs a server that misbehaves on purpose and
stays on the fake.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from attrs import evolve, frozen
from twisted.internet.task import Clock

from msgbroker.clientkit.testing import FakeConnection as KitFakeConnection
from msgbroker.clientkit.testing import FakeServer, MemoryWire
from msgbroker.errors import RemoteProtocolError
from msgbroker.filters import matches_all
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.client import MM2ClientProtocol, connect
from msgbroker.plugins.mm2.codec import (
    ActiveExtensions,
    ErrorFrame,
    Extension,
    ExtensionFrame,
    FrameDecoder,
    Handshake,
    HandshakeDecoder,
    MessageFrame,
    Reassembler,
    Subscribe,
    Unsubscribe,
    ack_frame,
    acked_count,
    batch_ack_max_count,
    check_confirm,
    encode_frame,
    encode_handshake,
    encode_message,
    next_seq,
    parse_ack,
    parse_pubsub,
)
from tests.ssmp.e2e_support import WAIT, ReactorThread, RunningBroker, parse_address, running_broker

SUPPORTED = frozenset({"pubsub", "ack", "batch-ack", "json", "dotnet"})
#: what the fake (like the broker) suggests of its own in step 2
OFFERED = ("pubsub", "batch-ack")


# -- a fake Micromessage2 server --------------------------------------------------------------


class FakeConnection(KitFakeConnection):
    """One client connection of :class:`FakeMM2Server` (lives in the reactor thread)."""

    def __init__(self, server: FakeMM2Server, transport: Any) -> None:
        super().__init__(server, transport)
        self.step = 1  # the handshake step expected next (4: done)
        self.handshake = HandshakeDecoder()
        self.frames = FrameDecoder()
        self.reply: Handshake | None = None
        self.hello: Handshake | None = None
        self.active = ActiveExtensions()
        self.subscriptions: dict[str, tuple[Any, ...]] = {}
        self.seq = 0
        self.window: int | None = None
        self.oldest = 1
        self.outstanding = 0
        self.waiting: deque[tuple[MessageFrame, str | None]] = deque()
        self.type_sent: str | None = None
        self.type_received: str | None = None
        self.reassembler = Reassembler()
        #: seqs received from the client that the server has not acknowledged yet
        self.unacked: list[int] = []

    @property
    def identity(self) -> str | None:
        return None if self.hello is None else self.hello.identity

    def ready(self, active: ActiveExtensions) -> None:
        self.active = active
        windows = [1] if "ack" in active else []
        batch = active.by_name("batch-ack")
        if batch is not None:
            windows.append(batch_ack_max_count(batch))
        self.window = min(windows, default=None)

    def deliver(self, frame: MessageFrame, type_name: str | None = None) -> None:
        """Send a message (seq assigned here), or queue it while the window is full."""
        self.waiting.append((frame, type_name))
        self._drain()

    def _drain(self) -> None:
        while self.waiting and (self.window is None or self.outstanding < self.window):
            frame, type_name = self.waiting.popleft()
            dotnet = self.active.id_of("dotnet")
            if dotnet is not None and type_name is not None and type_name != self.type_sent:
                self.write(encode_frame(ExtensionFrame(dotnet, type_name.encode())))
                self.type_sent = type_name
            self.seq = next_seq(self.seq)
            if self.window is not None:
                if not self.outstanding:
                    self.oldest = self.seq
                self.outstanding += 1
            self.write(encode_message(MessageFrame(self.seq, frame.destination, frame.payload,
                                                   frame.properties)))  # fmt: skip

    def acked(self, seq: int) -> None:
        count = acked_count(self.oldest, self.outstanding, seq) if self.outstanding else 0
        self.outstanding -= count
        self.oldest = (self.oldest - 1 + count) % 0xFFFF + 1
        self._drain()

    def ack(self, seq: int | None = None) -> None:
        """Acknowledge the client's messages up to ``seq`` (default: all received)."""
        ack_id = self.active.id_of("ack") or self.active.id_of("batch-ack")
        if ack_id is None or not self.unacked:
            return
        seq = self.unacked[-1] if seq is None else seq
        del self.unacked[: self.unacked.index(seq) + 1]
        self.write(encode_frame(ack_frame(ack_id, seq)))

    def error(self, text: str) -> None:
        """Send an ERROR frame and close, as a server does."""
        self.write(encode_frame(ErrorFrame(text)))
        self.drop()


class FakeMM2Server(FakeServer):
    """A fake Micromessage2 server on a loopback port in ``thread`` (on the client kit's
    :class:`~msgbroker.clientkit.testing.FakeServer`). Its step 2 is ``identity``,
    ``required``, ``optional``, ``major``, ``minor``, or ``reply`` when a test sets one;
    without ``optional`` it suggests what the broker does (docs/mm2.md): the client's
    optional extensions it supports, as the client wrote them, then its own
    (:data:`OFFERED`). ``refuse`` sends that ERROR text instead. ``supported`` is what it
    accepts in step 3. ``hold_acks`` keeps it from acknowledging what clients publish until
    a test calls ``conn.ack()``. Its log holds what clients sent — a Handshake, a frame,
    ``("refused", why)`` — and ``None`` once a connection ended."""

    connection_class = FakeConnection

    def __init__(
        self,
        thread: ReactorThread,
        *,
        identity: str = "fake",
        required: tuple[str | Extension, ...] = (),
        optional: tuple[str | Extension, ...] | None = None,
        major: int = 1,
        minor: int = 1,
        refuse: str | None = None,
        supported: frozenset[str] = SUPPORTED,
        hold_acks: bool = False,
    ) -> None:
        super().__init__(thread)
        self._base = Handshake(identity, required, optional or (), major, minor)
        #: a fixed step 2 (None: suggest like the broker); tests may set one
        self.reply: Handshake | None = None if optional is None else self._base
        self.refuse = refuse
        self.supported = supported
        self.hold_acks = hold_acks

    def received(self, conn: FakeConnection, data: bytes) -> None:
        try:
            self._handshake(conn, data)
        except RemoteProtocolError as e:
            self.record(conn, ("refused", str(e)))
            conn.error(str(e))

    def _handshake(self, conn: FakeConnection, data: bytes) -> None:
        while conn.step in (1, 3):
            message = conn.handshake.feed(data)
            if message is None:
                return
            self.record(conn, message)
            data, conn.handshake = conn.handshake.trailing_data, HandshakeDecoder()
            if isinstance(message, ErrorFrame):
                return
            if conn.step == 1:
                conn.hello = message
                if self.refuse is not None:
                    conn.error(self.refuse)
                    return
                conn.reply = self.reply_to(message)
                conn.write(encode_handshake(conn.reply))
                conn.step = 3
            else:
                assert conn.hello is not None and conn.reply is not None
                conn.ready(check_confirm(conn.hello, conn.reply, message, self.supported))
                conn.step = 4
        for frame in conn.frames.feed(data):
            self.record(conn, frame)
            self.frame(conn, frame)

    def reply_to(self, hello: Handshake) -> Handshake:
        """Step 2 for the client's step 1."""
        if self.reply is not None:
            return self.reply
        taken = {ext.name for ext in self._base.required}
        optional = []
        for ext in (*hello.optional, *(Extension(name) for name in OFFERED)):
            if ext.name in self.supported and ext.name not in taken:
                taken.add(ext.name)
                optional.append(ext)
        return evolve(self._base, optional=tuple(optional))

    # -- routing (reactor thread) -------------------------------------------------------------

    def frame(self, conn: FakeConnection, frame: Any) -> None:
        if isinstance(frame, MessageFrame):
            whole = conn.reassembler.feed(frame)
            if whole is None:
                return
            conn.unacked.append(whole.seq)
            self.route(conn, whole, conn.type_received)
            if not self.hold_acks:
                conn.ack()
        elif isinstance(frame, ExtensionFrame):
            name = conn.active.get(frame.ext_id)
            if name is not None and name.name in ("ack", "batch-ack"):
                conn.acked(parse_ack(frame))
            elif name is not None and name.name == "dotnet":
                conn.type_received = frame.payload.decode()
        elif not isinstance(frame, ErrorFrame):
            request = parse_pubsub(frame)
            if isinstance(request, Subscribe):
                conn.subscriptions[request.destination] = request.filters
            elif isinstance(request, Unsubscribe):
                conn.subscriptions.pop(request.destination, None)

    def route(self, conn: FakeConnection, message: MessageFrame, type_name: str | None) -> None:
        if message.destination.startswith("@"):
            targets = [c for c in self.connections if c.identity == message.destination[1:]]
            destination = f"@{conn.identity}"
        else:
            props = dict(message.properties)
            targets = [
                c
                for c in self.connections
                if c is not conn
                and message.destination in c.subscriptions
                and matches_all(c.subscriptions[message.destination], props)
            ]
            destination = message.destination
        for target in targets:
            if not target.closed:
                frame = MessageFrame(1, destination, message.payload, message.properties)
                target.deliver(frame, type_name)


# -- the real broker, for the marked tests --------------------------------------------------------

#: the broker's Micromessage2 listener
BROKER_LISTENERS = ("mm2=tcp:0:interface=127.0.0.1",)


@frozen
class BrokerTarget:
    """The ``mm2`` listener of a real broker, with the attributes of :class:`FakeMM2Server`
    that the helpers and the marked tests use."""

    thread: ReactorThread
    host: str
    port: int
    running: RunningBroker

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.thread.call(fn, *args)


Target = FakeMM2Server | BrokerTarget


@contextmanager
def mm2_broker() -> Iterator[RunningBroker]:
    """A broker with :data:`BROKER_LISTENERS` and open login."""
    with running_broker(BROKER_LISTENERS, auth=("open",)) as running:
        yield running


def broker_target(running: RunningBroker) -> BrokerTarget:
    host, port = parse_address(running.service.broker.listening[0][1])
    return BrokerTarget(running.thread, host, port, running)


@contextmanager
def fake_or_broker(request: pytest.FixtureRequest, thread: ReactorThread) -> Iterator[Target]:
    """The target a ``target`` fixture's param names: a :class:`FakeMM2Server` ("fake"), or the
    test's ``broker`` fixture ("broker"), which is only requested then."""
    if request.param == "fake":
        with FakeMM2Server(thread) as running:
            yield running
    else:
        yield broker_target(request.getfixturevalue("broker"))


def broker_connection(target: BrokerTarget, identity: str) -> Any:
    """The broker's :class:`MM2ServerSession` of the client logged in as ``identity`` (in
    the reactor thread: read it there, through ``target.call``)."""
    session = target.running.service.broker.hub.lookup(identity)
    assert session is not None, f"nobody is logged in as {identity!r}"
    return session.link.server  # the connection adapter's server session


#: what :func:`settle` sends itself (valid JSON, so it also goes with ``json`` active)
SETTLE = b'"settled"'


def settle(client: BlockingMM2Client) -> None:
    """A round trip: ``client`` unicasts to itself and reads that message back. COMMAND
    frames take effect before any later frame of the connection (docs/mm2.md), so what it
    subscribed before is in force on the server once this returns."""
    client.unicast(client.session.hello.identity, SETTLE)
    message = client.next_message(WAIT)
    assert message is not None and message.payload == SETTLE


def twisted_client(server: Target, **options: Any) -> Any:
    """Connect from the reactor thread; the ready protocol."""
    thread = server.thread
    return thread.call(lambda: connect(thread.reactor, server.host, server.port, **options))


def blocking_client(server: Target, **options: Any) -> BlockingMM2Client:
    options.setdefault("timeout", WAIT)
    return BlockingMM2Client(server.host, server.port, **options)


# -- Twisted, on a Clock and a StringTransport ----------------------------------------------------


class Wire(MemoryWire):
    """An :class:`MM2ClientProtocol` on a StringTransport and a Clock; the test plays the
    server with the codec."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("identity", "alice")
        clock = Clock()
        self._frames = FrameDecoder()
        super().__init__(MM2ClientProtocol(clock=clock, **options), clock, self._frames.feed,
                         encode_frame)  # fmt: skip
        self.hello = self.read_handshake()
        self.confirm: Handshake | None = None

    def read_handshake(self) -> Handshake:
        decoder = HandshakeDecoder()
        message = decoder.feed(self.transport.value())
        assert isinstance(message, Handshake)
        self.transport.clear()
        self._frames.receive_data(decoder.trailing_data)  # frames written right after it
        return message

    def handshake(self, reply: Handshake | None = None) -> Handshake:
        """Send step 2 (default: offers everything, requires nothing); the client's step 3."""
        reply = reply or Handshake("srv", (), ("pubsub", "ack", "batch-ack", "json", "dotnet"))
        self.proto.dataReceived(encode_handshake(reply))
        self.confirm = self.read_handshake()
        return self.confirm
