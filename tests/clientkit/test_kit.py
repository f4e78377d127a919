"""The client kit on its own, with a toy protocol the way a third-party plugin would write
one: a line protocol whose server answers each ``ASK text`` line with ``ANS TEXT`` (upper
case) and may push ``NEWS text`` lines. One sans-IO session, its Twisted and blocking
clients in a few lines each, its command on the CLI skeleton; all against the kit's
FakeServer over TCP, TLS, WebSocket and unix seqpacket, and on a Clock for the timers."""

from __future__ import annotations

import argparse
import io
import socket
import time
from collections import deque
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from msgbroker.cli import CommandError
from msgbroker.clientkit import cli as kit_cli
from msgbroker.clientkit.blocking import (
    BlockingClient,
    PacketChannel,
    StreamChannel,
    open_tcp,
    open_unix,
)
from msgbroker.clientkit.protocol import (
    ClientFactory,
    ReconnectingClient,
    StreamClientProtocol,
    client_endpoint,
    connect_client,
)
from msgbroker.clientkit.session import ClientSession, ConnectionClosed, Timers
from msgbroker.clientkit.testing import WAIT, FakeServer, Inbox, MemoryWire, ReactorThread
from msgbroker.clientkit.tls import client_tls_options, ssl_context
from msgbroker.clientkit.websocket import WebSocketChannel
from msgbroker.errors import RemoteProtocolError
from tests.certs import make_pki
from tests.ssmp.e2e_support import reactor_thread

# -- the toy protocol: codec, session, clients, command -------------------------------------------


class LineClosed(ConnectionClosed):
    pass


class LineSession(ClientSession):
    """ASK lines answered in order by ANS lines; NEWS lines are events. With ``idle``, a
    ``PING`` line after that many seconds of silence (a timer)."""

    closed_error = LineClosed

    def __init__(self, idle: float | None = None, packets: bool = False) -> None:
        super().__init__()
        self.idle = idle
        self.packets = packets  # one line a unit, without the LF
        self._asked: deque[int] = deque()
        self._buffer = b""
        self._due: float | None = None

    def ask(self, text: str) -> int:
        if "\n" in text:
            raise ValueError("one line")
        self.check_open()
        token = self._token()
        self._asked.append(token)
        self._send(b"ASK " + text.encode() + (b"" if self.packets else b"\n"))
        return token

    def _started(self, now: float) -> None:
        if self.idle:
            self._due = now + self.idle

    def next_tick(self) -> float | None:
        return self._due

    def _tick(self, now: float) -> None:
        assert self.idle and self._due is not None
        self._send(b"PING" + (b"" if self.packets else b"\n"))
        self._due = now + self.idle

    def _received(self, data: Any, now: float) -> None:
        if self.idle:
            self._due = now + self.idle
        if self.packets:
            lines = [data]
        else:
            *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            verb, _, text = line.partition(b" ")
            if verb == b"ANS" and self._asked:
                self._answer(self._asked.popleft(), text.decode())
            elif verb == b"NEWS":
                self._emit(text.decode())
            else:
                raise RemoteProtocolError(f"unexpected line {line!r}")


class TwistedLineClient(StreamClientProtocol):
    session: LineSession

    def __init__(self, clock: Any = None, on_news: Any = None, idle: float | None = None):
        super().__init__(LineSession(idle), clock)
        self.on_news = on_news or (lambda text: None)

    def ask(self, text: str) -> defer.Deferred[str]:
        return self._request(lambda: self.session.ask(text))

    def _dispatch(self, event: Any) -> None:
        self._deliver(self.on_news, event)


class BlockingLineClient(BlockingClient):
    session: LineSession

    def __init__(self, channel: StreamChannel, packets: bool = False, idle: float | None = None,
                 clock: Any = None, ws: bool = False) -> None:  # fmt: skip
        self.news: deque[str] = deque()
        kw = {"clock": clock} if clock is not None else {}
        session = WebSocketLines(idle) if ws else LineSession(idle, packets)
        super().__init__(session, channel, timeout=WAIT, **kw)

    def ask(self, text: str, timeout: float | None = None) -> str:
        answer: str = self._wait(self.session.ask(text), timeout)
        return answer

    def next_news(self, timeout: float | None = None) -> str | None:
        news: str | None = self._next(self.news, timeout)
        return news

    def _event(self, event: Any) -> None:
        self.news.append(event)


class LineServer(FakeServer):
    """Answers ASK with the text in upper case (``quiet``: never), records the other lines,
    sends ``news`` to each client as it connects."""

    def __init__(self, thread: Any, news: tuple[str, ...] = (), quiet: bool = False, **kw: Any):
        super().__init__(thread, **kw)
        self.news = news
        self.quiet = quiet

    def connected(self, conn: Any) -> None:
        for text in self.news:
            self._write(conn, b"NEWS " + text.encode())

    def received(self, conn: Any, unit: Any) -> None:
        data = unit[1] if self.ws else unit
        for line in data.split(b"\n") if not self.seqpacket else [data]:
            if not line:
                continue
            self.record(conn, line)
            if line.startswith(b"ASK ") and not self.quiet:
                self._write(conn, b"ANS " + line[4:].upper())

    def _write(self, conn: Any, line: bytes) -> None:
        if self.ws:
            conn.write((False, line + b"\n"))
        elif self.seqpacket:
            conn.write(line)
        else:
            conn.write(line + b"\n")


class WebSocketLines(LineSession):
    """The line session over WebSocket messages: a message is a chunk of lines."""

    def _send(self, unit: Any) -> None:
        super()._send((False, unit))

    def _received(self, data: Any, now: float) -> None:
        super()._received(data[1], now)


class LineCommand(kit_cli.ClientCommand):
    options = (kit_cli.HOST, kit_cli.port(4450, "broker port [4450]"), kit_cli.timeout())

    def add_actions(self, add: Any) -> None:
        add("ask", help="ask TEXT").add_argument("text")

    def open(self, args: argparse.Namespace) -> BlockingLineClient:
        sock = open_tcp(args.host, args.port, timeout=args.timeout)
        return BlockingLineClient(StreamChannel(sock))

    def act(self, client: BlockingLineClient, args: argparse.Namespace) -> int:
        print(client.ask(args.text))
        return 0


@pytest.fixture(scope="module")
def thread() -> ReactorThread:
    return reactor_thread()


# -- the sans-IO pieces --------------------------------------------------------------------------


def test_timers_expire_soonest_first_and_forget_cancelled_and_reset_ones():
    timers: Timers[Any] = Timers()
    timers.set("a", 3.0)
    timers.set(1, 1.0)
    timers.set("b", 2.0)
    timers.cancel("b")
    timers.set("a", 5.0)  # moved: its old deadline is stale
    assert timers.next_due() == 1.0
    assert timers.expired(4.0) == [1]
    assert timers.next_due() == 5.0 and "a" in timers
    assert timers.expired(5.0) == ["a"]
    assert timers.next_due() is None and timers.expired(100.0) == []


def test_a_session_answers_tokens_emits_events_and_ends_on_a_protocol_error():
    session = LineSession()
    session.start(0.0)
    first, second = session.ask("a"), session.ask("b")
    assert session.outgoing() == [b"ASK a\n", b"ASK b\n"]
    events = session.receive(b"ANS A\nNEWS hi\nAN", 1.0)
    assert [type(e).__name__ for e in events] == ["Answered", "str"]
    assert events[0].token == first and events[0].value == "A"
    (answered,) = session.receive(b"S B\n", 1.0)
    assert answered.token == second
    (ended,) = session.receive(b"WHAT\n", 1.0)
    assert isinstance(ended.error, RemoteProtocolError) and session.ended
    assert session.receive(b"ANS late\n", 1.0) == []
    with pytest.raises(LineClosed, match="unexpected line"):
        session.ask("c")


# -- the Twisted driver --------------------------------------------------------------------------


def memory_client(**options: Any) -> tuple[TwistedLineClient, Any, Clock]:
    """The toy client on the kit's MemoryWire (a StringTransport, a Clock)."""
    clock = Clock()
    wire = MemoryWire(TwistedLineClient(clock=clock, **options), clock)
    return wire.proto, wire.transport, clock


def test_twisted_driver_fires_answers_delivers_events_and_runs_timers_on_its_clock():
    news = Inbox()
    proto, transport, clock = memory_client(on_news=news, idle=5)
    answer = proto.ask("x")
    assert transport.value() == b"ASK x\n"
    proto.dataReceived(b"NEWS n\nANS X\n")
    assert news.items == ["n"] and answer.result == "X"
    transport.clear()
    clock.advance(4.9)
    assert transport.value() == b""
    clock.advance(0.1)
    assert transport.value() == b"PING\n"
    with pytest.raises(ValueError, match="one line"):
        proto.ask("two\nlines")  # raised at once, nothing sent


def test_twisted_driver_fails_pending_and_closes_on_a_protocol_error():
    proto, transport, clock = memory_client(idle=5)
    pending = proto.ask("x")
    failures: list[Any] = []
    pending.addErrback(failures.append)
    proto.dataReceived(b"GARBAGE\n")
    assert transport.disconnecting and failures[0].check(RemoteProtocolError)
    assert clock.getDelayedCalls() == []
    later = proto.ask("y")
    later.addErrback(failures.append)
    assert failures[1].check(RemoteProtocolError)


def test_twisted_close_fails_pending_and_fires_when_closed():
    proto, transport, _ = memory_client()
    pending = proto.ask("x")
    pending.addErrback(lambda f: f.trap(LineClosed))
    closing = proto.close()
    assert transport.disconnecting and not closing.called
    proto.connectionLost(None)
    assert closing.called and proto.closed


def test_twisted_client_over_tcp_and_tls_with_the_kits_endpoint(thread, tmp_path):
    pki = make_pki(tmp_path)
    from msgbroker.tls import server_context_factory

    context = server_context_factory(str(pki.server.cert), str(pki.server.key), None)
    for tls in (None, context):
        with LineServer(thread, news=("hello",), tls=tls) as server:
            news = Inbox()
            creator = client_tls_options("127.0.0.1", ca=str(pki.ca.cert_path)) if tls else None
            endpoint = client_endpoint(thread.reactor, "127.0.0.1", server.port, tls=creator)
            factory = ClientFactory(TwistedLineClient, clock=thread.reactor, on_news=news)
            proto = thread.call(connect_client, endpoint, factory, lambda p: p.ask("hi"))
            assert thread.call(news.get) == "hello"
            assert thread.call(proto.ask, "again") == "AGAIN"
            thread.call(proto.close)
            assert server.wait(lambda: server.ended(0))


def test_reconnecting_client_connects_again_and_prepares_each_connection(thread):
    with LineServer(thread) as server:
        endpoint = client_endpoint(thread.reactor, "127.0.0.1", server.port)
        factory = ClientFactory(TwistedLineClient, clock=thread.reactor)
        client = ReconnectingClient(
            thread.reactor, endpoint, factory, lambda p: p.ask("login"), retry=lambda n: 0.01
        )
        thread.call(client.start)
        first = thread.call(client.when_connected)
        thread.call(server.connections[0].abort)
        thread.call(first.when_closed)
        second = thread.call(client.when_connected)
        assert second is not first
        assert thread.call(second.ask, "x") == "X"
        assert server.logged(conn=0) == [b"ASK login"]
        assert server.logged(conn=1) == [b"ASK login", b"ASK x"]
        thread.call(client.stop)
        assert server.wait(lambda: server.ended(1))


# -- the blocking driver -------------------------------------------------------------------------


def test_blocking_client_over_tcp_asks_queues_events_and_polls(thread):
    with LineServer(thread, news=("one", "two")) as server:
        sock = open_tcp("127.0.0.1", server.port, timeout=WAIT)
        with BlockingLineClient(StreamChannel(sock)) as client:
            assert client.ask("hi") == "HI"  # the news came first: queued meanwhile
            assert client.next_news(0) == "one" and client.next_news(WAIT) == "two"
            assert client.next_news(0) is None
        assert client.closed
        with pytest.raises(LineClosed):
            client.ask("late")


def test_blocking_timers_run_while_reading_and_in_poll(thread):
    now = [100.0]
    with LineServer(thread) as server:
        sock = open_tcp("127.0.0.1", server.port, timeout=WAIT)
        with BlockingLineClient(StreamChannel(sock), idle=30, clock=lambda: now[0]) as client:
            client.poll()
            now[0] += 30
            client.poll()  # the idle PING, without waiting
            server.wait(lambda: b"PING" in server.logged())


def test_blocking_wait_with_a_timeout_closes_the_connection(thread):
    with LineServer(thread, quiet=True) as server:
        client = BlockingLineClient(StreamChannel(open_tcp("127.0.0.1", server.port, timeout=1)))
        with pytest.raises(TimeoutError, match=r"no reply within 0\.1 s"):
            client.ask("x", timeout=0.1)
        assert client.closed


def test_blocking_client_sees_the_server_closing(thread):
    with LineServer(thread) as server:
        client = BlockingLineClient(StreamChannel(open_tcp("127.0.0.1", server.port, timeout=1)))
        client.ask("x")
        server.call(server.connections[0].drop)
        with pytest.raises(LineClosed, match="the server closed the connection"):
            client.next_news(WAIT)


def test_blocking_client_over_websocket(thread):
    with LineServer(thread, news=("ws news",), ws=True) as server:
        sock = open_tcp("127.0.0.1", server.port, timeout=WAIT)
        channel = WebSocketChannel(
            sock, "127.0.0.1", server.port, "/", max_message=1 << 16,
            deadline=time.monotonic() + WAIT, closed_error=LineClosed,
        )  # fmt: skip
        client = BlockingLineClient(channel, ws=True)
        assert client.next_news(WAIT) == "ws news"
        assert client.ask("over ws") == "OVER WS"
        client.close()  # the closing handshake
        assert server.wait(lambda: server.ended(0))


def test_blocking_client_over_unix_seqpacket(thread):
    with LineServer(thread, news=("packet",), seqpacket=True) as server:
        sock = open_unix(server.path, kind=socket.SOCK_SEQPACKET, timeout=WAIT)
        with BlockingLineClient(PacketChannel(sock, 1024), packets=True) as client:
            assert client.next_news(WAIT) == "packet"
            assert client.ask("p") == "P"
        assert server.wait(lambda: server.ended(0))


def test_ssl_context_verifies_the_server(thread, tmp_path):
    pki = make_pki(tmp_path)
    from msgbroker.tls import server_context_factory

    tls = server_context_factory(str(pki.server.cert), str(pki.server.key), None)
    with LineServer(thread, tls=tls) as server:
        context = ssl_context(str(pki.ca.cert_path))
        sock = open_tcp("127.0.0.1", server.port, timeout=WAIT, ssl_context=context)
        with BlockingLineClient(StreamChannel(sock)) as client:
            assert client.ask("tls") == "TLS"
            assert client.socket.version() in ("TLSv1.2", "TLSv1.3")


# -- the command skeleton --------------------------------------------------------------------------


def parse(command: kit_cli.ClientCommand, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_runs_an_action_and_says_errors_in_one_line(thread, capsys):
    command = LineCommand()
    with LineServer(thread) as server:
        assert command.run(parse(command, "ask", "hi", "--port", str(server.port))) == 0
    assert capsys.readouterr().out == "HI\n"
    with socket.socket() as bound:  # bound, not listening: refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot connect to 127.0.0.1:{port}: "):
            command.run(parse(command, "ask", "x", "--port", str(port)))
    with LineServer(thread, quiet=True) as server:
        server.received = lambda conn, unit: conn.drop()  # type: ignore[method-assign]
        args = parse(command, "ask", "x", "--port", str(server.port))
        with pytest.raises(CommandError, match=f"127.0.0.1:{server.port}: the server closed"):
            command.run(args)


def test_message_lines_are_the_message_or_the_non_empty_lines_of_stdin():
    stdin = io.BytesIO(b"a\n\nb\r\nc")
    assert list(kit_cli.message_lines(b"x", stdin)) == [b"x"]
    assert list(kit_cli.message_lines(b"-", stdin)) == [b"a", b"b", b"c"]


def test_what_is_asked_before_the_transport_opens_waits_for_it():
    proto = TwistedLineClient(clock=Clock())
    pending = proto.ask("early")  # not connected yet: nothing can be written
    transport = StringTransport()
    proto.makeConnection(transport)
    assert transport.value() == b"ASK early\n"
    proto.dataReceived(b"ANS EARLY\n")
    assert pending.result == "EARLY"
