"""Reconnecting, in the client kit alone: the policy's waits (exponential, capped, jittered),
and both drivers — the Twisted ``ReconnectingClient`` on a ``Clock`` with a scripted
endpoint, the blocking client on a fake clock and sleep against the kit's FakeServer —
with the toy line protocol of ``test_kit`` grown subscriptions: ``SUB topic`` requests the
session remembers once answered and replays after a reconnection. The protocols' own
reconnect tests (tests/*/test_reconnect.py) restart a real broker."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.error import ConnectionRefusedError as Refusal
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from msgbroker.clientkit.blocking import BlockingClient, StreamChannel, open_tcp
from msgbroker.clientkit.protocol import ClientFactory, StreamClientProtocol
from msgbroker.clientkit.reconnect import Backoff, Reconnect, Replay, Restored, gives_up
from msgbroker.clientkit.reconnecting import ReconnectingClient
from msgbroker.clientkit.testing import WAIT, result
from tests.clientkit.test_kit import LineClosed, LineServer, LineSession
from tests.ssmp.e2e_support import reactor_thread

# -- the toy protocol, with subscriptions --------------------------------------------------------


class Refused(Exception):
    """The server answered ``ERR``."""


class SubSession(LineSession):
    """``ask("SUB topic")`` subscribes: remembered once answered, replayed (in order) on a
    new session; an ``ERR text`` line refuses the oldest request."""

    def __init__(self, idle: float | None = None) -> None:
        super().__init__(idle)
        self.topics: list[str] = []
        self._subscribing: dict[int, str] = {}

    def ask(self, text: str) -> int:
        token = super().ask(text)
        if text.startswith("SUB "):
            self._subscribing[token] = text[4:]
        return token

    def _answer(self, token: int, value: Any = None) -> None:
        topic = self._subscribing.pop(token, None)
        if topic is not None:
            self.topics.append(topic)
        super()._answer(token, value)

    def _received(self, data: Any, now: float) -> None:
        if data.startswith(b"ERR ") and self._asked:
            self._fail(self._asked.popleft(), Refused(data[4:].decode().strip()))
            return
        super()._received(data, now)

    def replay(self) -> list[Replay]:
        return [Replay(f"SUB {topic}", _sub(topic)) for topic in self.topics]


def _sub(topic: str) -> Any:
    return lambda session, now: session.ask(f"SUB {topic}")


class TwistedSubClient(StreamClientProtocol):
    session: SubSession

    def __init__(self, clock: Any = None) -> None:
        super().__init__(SubSession(), clock)

    def ask(self, text: str) -> defer.Deferred[str]:
        return self._request(lambda: self.session.ask(text))


class BlockingSubClient(BlockingClient):
    """Connects to the ports of ``ports`` in turn (the last one for good)."""

    session: SubSession

    def __init__(self, ports: list[int], *, time: FakeTime, reconnect: Reconnect) -> None:
        self.ports = list(ports)
        self.opened: list[int] = []
        self.news: deque[str] = deque()
        super().__init__(
            SubSession(), self._channel_to_next(), timeout=WAIT, clock=time.clock,
            reconnect=reconnect, sleep=time.sleep,
        )  # fmt: skip
        self._opened()

    def _channel_to_next(self) -> StreamChannel:
        port = self.ports.pop(0) if len(self.ports) > 1 else self.ports[0]
        self.opened.append(port)
        return StreamChannel(open_tcp("127.0.0.1", port, timeout=WAIT))

    def _reopen(self) -> tuple[SubSession, StreamChannel]:
        return SubSession(), self._channel_to_next()

    def ask(self, text: str, timeout: float | None = None) -> str:
        answer: str = self._ask(lambda: self.session.ask(text), timeout)
        return answer

    def next_news(self, timeout: float | None = None) -> str | None:
        news: str | None = self._next(self.news, timeout)
        return news

    def _event(self, event: Any) -> None:
        self.news.append(event)


class SubServer(LineServer):
    """Answers as LineServer does; with ``refusing``, ``SUB forbidden`` gets ``ERR no``;
    ``ASK drop`` drops the connection unanswered."""

    refusing = False

    def received(self, conn: Any, unit: Any) -> None:
        for line in unit.split(b"\n"):
            if line == b"ASK drop":
                self.record(conn, line)
                conn.drop()
                return
            if line == b"ASK SUB forbidden" and self.refusing:
                self.record(conn, line)
                conn.write(b"ERR no\n")
                return
        super().received(conn, unit)


@pytest.fixture(scope="module")
def thread() -> Any:
    return reactor_thread()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections (bound, never listening)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


class FakeTime:
    """A clock and a sleep that moves it (the sleeps are kept)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


# -- the policy ------------------------------------------------------------------------------------


def test_waits_grow_by_the_factor_up_to_the_cap():
    policy = Reconnect(initial=0.5, factor=2.0, max_delay=4.0, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.delay(10_000) == 4.0  # no overflow


@pytest.mark.parametrize(("draw", "waits"), [(0.0, [0.5, 1.0, 2.0]), (1.0, [0.25, 0.5, 1.0])])
def test_jitter_takes_up_to_its_share_off_each_wait(draw, waits):
    policy = Reconnect(initial=0.5, jitter=0.5, random=lambda: draw)
    assert [policy.delay(n) for n in (1, 2, 3)] == waits


@pytest.mark.parametrize(
    "settings",
    [{"initial": -1}, {"factor": 0.5}, {"jitter": 1.5}, {"attempts": 0}, {"max_delay": -2}],
)
def test_a_policy_that_makes_no_sense_is_refused(settings):
    with pytest.raises(ValueError):
        Reconnect(**settings)


def test_backoff_counts_failures_spends_attempts_and_slows_down_quick_losses():
    backoff = Backoff(Reconnect(initial=1.0, max_delay=8.0, jitter=0.0, attempts=3))
    backoff.up(0.0)
    assert backoff.lost([], 100.0) == 1.0  # up for 100 s: the waits start over
    assert backoff.failed() == 2.0 and backoff.failed() == 4.0
    assert backoff.failed() is None  # the third failure: given up
    backoff.restored([], 200.0)
    assert backoff.lost([], 201.0) == 2.0  # up for 1 s only: one step more
    backoff.restored([], 202.0)
    assert backoff.lost([], 203.0) == 4.0  # again
    assert backoff.failed() == 8.0
    backoff.restored([], 300.0)
    assert backoff.lost([], 400.0) == 1.0  # up long enough: over


def test_only_refusals_and_unverifiable_brokers_end_reconnecting():
    import ssl

    assert not gives_up(OSError(111, "Connection refused"))
    assert not gives_up(TimeoutError())
    assert not gives_up(LineClosed("lost"))
    assert gives_up(Refused("no"))
    assert gives_up(ssl.SSLCertVerificationError("bad certificate"))


# -- the Twisted driver, on a Clock ----------------------------------------------------------------


class ScriptedEndpoint:
    """Each connect takes the next outcome: "refuse", or "accept" (a StringTransport).
    ``connections`` are what ClientService sees (its proxies: lose them, not the
    protocols)."""

    def __init__(self, clock: Clock, outcomes: list[str]) -> None:
        self.clock = clock
        self.outcomes = outcomes
        self.attempts: list[float] = []
        self.connections: list[Any] = []

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        self.attempts.append(self.clock.seconds())
        if self.outcomes.pop(0) == "refuse":
            return defer.fail(Refusal("refused"))
        proto = factory.buildProtocol(None)
        proto.makeConnection(StringTransport())
        self.connections.append(proto)
        return defer.succeed(proto)


def answer_all(conn: Any, answer: bytes = b"") -> None:
    """Answer each ASK ``conn`` wrote, in order (with ``answer`` if given)."""
    written = conn.transport.value().decode().splitlines()
    conn.transport.clear()
    for line in written:
        if line.startswith("ASK "):
            conn.dataReceived(answer or ("ANS " + line[4:].upper() + "\n").encode())


def lose(conn: Any) -> None:
    conn.connectionLost(Failure(ConnectionDone("gone")))


def reconnecting(clock: Clock, outcomes: list[str], **policy: Any) -> tuple[Any, Any]:
    endpoint = ScriptedEndpoint(clock, outcomes)
    client = ReconnectingClient(
        clock, endpoint, ClientFactory(TwistedSubClient, clock=clock),
        reconnect=Reconnect(jitter=0.0, **policy),
    )  # fmt: skip
    client.start()
    return client, endpoint


def test_twisted_client_waits_between_attempts_and_replays_the_subscriptions():
    clock = Clock()
    news: list[Any] = []
    client, endpoint = reconnecting(
        clock, ["accept", "refuse", "refuse", "accept"], initial=0.5, factor=2.0,
        on_lost=news.append, on_restored=news.append,
    )  # fmt: skip
    first = endpoint.connections[0]
    assert result(client.when_connected()).transport is first.transport
    asked = client.protocol.ask("SUB news")
    answer_all(first)
    assert result(asked) == "SUB NEWS"

    clock.advance(100)
    lose(first)
    assert client.protocol is None and isinstance(news[0], LineClosed)
    clock.advance(0.5)  # the first wait: initial
    assert endpoint.attempts == [0.0, 100.5]
    clock.advance(1.0)  # refused: twice as long
    assert endpoint.attempts == [0.0, 100.5, 101.5]
    clock.advance(1.9)
    assert len(endpoint.attempts) == 3
    clock.advance(0.1)  # refused again: 2 s
    assert endpoint.attempts[-1] == pytest.approx(103.5)
    second = endpoint.connections[-1]
    assert second.transport.value() == b"ASK SUB news\n"  # replayed, not answered yet
    assert client.protocol is None
    answer_all(second)
    assert client.protocol.transport is second.transport
    assert news[1] == Restored(3, ("SUB news",))


def test_twisted_client_gives_up_when_the_replay_is_refused():
    clock = Clock()
    client, endpoint = reconnecting(clock, ["accept", "accept"], initial=1.0)
    first = endpoint.connections[0]
    asked = client.protocol.ask("SUB forbidden")
    answer_all(first)
    result(asked)
    stopped = client.when_stopped()
    clock.advance(100)
    lose(first)
    clock.advance(1.0)
    answer_all(endpoint.connections[-1], b"ERR no\n")
    clock.advance(0)
    assert isinstance(result(stopped), Refused)
    assert client.closed and not client.service.running
    assert len(endpoint.attempts) == 2
    with pytest.raises(Refused):
        result(client.when_connected())


def test_twisted_client_gives_up_after_its_attempts():
    clock = Clock()
    client, endpoint = reconnecting(
        clock, ["accept", "refuse", "refuse", "refuse"], initial=1.0, factor=1.0, attempts=2
    )
    stopped = client.when_stopped()
    clock.advance(100)
    lose(endpoint.connections[0])
    for _ in range(4):
        clock.advance(1.0)
    error = result(stopped)
    assert isinstance(error, LineClosed)
    assert str(error).startswith("gave up after 2 attempts: ")
    assert endpoint.attempts == [0.0, 101.0, 102.0]
    assert not client.service.running


def test_twisted_requests_fail_at_once_while_reconnecting_and_in_flight_ones_are_not_resent():
    clock = Clock()
    client, endpoint = reconnecting(clock, ["accept", "accept"], initial=1.0)
    in_flight = client.protocol.ask("publish")
    lose(endpoint.connections[0])
    with pytest.raises(LineClosed):
        result(in_flight)
    with pytest.raises(LineClosed, match="not connected: reconnecting"):
        client._live()
    with pytest.raises(LineClosed, match="not connected: reconnecting"):
        result(client._forward_deferred(lambda proto: proto.ask("x")))
    connected = client.when_connected()
    clock.advance(2.0)  # a quick loss: the first wait is one step longer
    second = endpoint.connections[-1]
    assert second.transport.value() == b""  # nothing to replay, nothing sent again
    assert result(connected).transport is second.transport
    stopping = client.stop()
    lose(second)
    result(stopping)
    assert client.closed and not client.service.running


# -- the blocking driver, on a fake clock ----------------------------------------------------------


def test_blocking_client_reconnects_within_a_call_waiting_for_news(thread, refused_port):
    time = FakeTime()
    news: list[Any] = []
    policy = Reconnect(initial=0.5, factor=2.0, jitter=0.0, on_lost=news.append,
                       on_restored=news.append)  # fmt: skip
    with SubServer(thread) as first, SubServer(thread, news=("back",)) as second:
        ports = [first.port, refused_port, refused_port, second.port]
        client = BlockingSubClient(ports, time=time, reconnect=policy)
        assert client.ask("SUB news") == "SUB NEWS"
        time.now += 100
        first.call(first.connections[0].drop)
        assert client.next_news(timeout=10.0) == "back"
        assert time.sleeps == [0.5, 1.0, 2.0]
        assert client.opened == ports
        assert second.logged(conn=0) == [b"ASK SUB news"]
        assert isinstance(news[0], LineClosed)
        assert news[1] == Restored(3, ("SUB news",))
        assert not client.reconnecting
        client.close()


def test_blocking_call_waits_for_the_broker_up_to_its_timeout(thread, refused_port):
    time = FakeTime()
    with SubServer(thread) as first, SubServer(thread) as second:
        client = BlockingSubClient(
            [first.port, refused_port, second.port], time=time,
            reconnect=Reconnect(initial=1.0, factor=4.0, jitter=0.0),
        )  # fmt: skip
        time.now += 100
        first.wait(lambda: first.connections)
        first.call(first.connections[0].drop)
        assert client.next_news(timeout=0.25) is None  # lost meanwhile; 1 s to wait
        assert client.reconnecting
        assert client.next_news(timeout=2.0) is None  # refused, then 4 s to wait: too late
        assert time.sleeps == [0.25, 0.75, 1.25]
        with pytest.raises(LineClosed, match="did not come back within 1 s"):
            client.ask("hi", timeout=1.0)
        assert client.ask("hi", timeout=5.0) == "HI"  # what is left of the 4 s, then sent
        assert time.sleeps == [0.25, 0.75, 1.25, 1.0, 1.75]
        client.close()


def test_blocking_request_in_flight_fails_and_is_never_sent_again(thread):
    time = FakeTime()
    with SubServer(thread) as server:
        client = BlockingSubClient(
            [server.port], time=time, reconnect=Reconnect(initial=0.5, jitter=0.0)
        )
        assert client.ask("SUB a") == "SUB A"
        with pytest.raises(LineClosed):
            client.ask("drop")
        assert client.ask("after") == "AFTER"  # reconnected first
        assert server.logged(conn=0) == [b"ASK SUB a", b"ASK drop"]
        assert server.logged(conn=1) == [b"ASK SUB a", b"ASK after"]
        assert time.sleeps == [1.0]  # lost at once: one step more than initial
        client.close()
        assert not client.reconnecting
        with pytest.raises(LineClosed):
            client.ask("closed")


def test_blocking_client_gives_up_when_the_replay_is_refused(thread):
    time = FakeTime()
    with SubServer(thread) as server:
        client = BlockingSubClient(
            [server.port], time=time, reconnect=Reconnect(initial=0.5, jitter=0.0)
        )
        assert client.ask("SUB forbidden") == "SUB FORBIDDEN"
        server.refusing = True
        server.call(server.connections[0].drop)
        with pytest.raises(Refused):
            client.next_news(timeout=5.0)
        assert not client.reconnecting and client.closed
        assert server.logged(conn=1) == [b"ASK SUB forbidden"]


def test_blocking_client_gives_up_after_its_attempts(thread, refused_port):
    time = FakeTime()
    with SubServer(thread) as server:
        client = BlockingSubClient(
            [server.port, refused_port], time=time,
            reconnect=Reconnect(initial=1.0, factor=1.0, jitter=0.0, attempts=3),
        )  # fmt: skip
        server.wait(lambda: server.connections)
        server.call(server.connections[0].drop)
        with pytest.raises(LineClosed, match="gave up reconnecting after 3 attempts: "):
            client.next_news(timeout=None)
        assert time.sleeps == [1.0, 1.0, 1.0]
        assert not client.reconnecting


def test_a_client_without_reopen_cannot_reconnect(thread):
    with SubServer(thread) as server:
        sock = open_tcp("127.0.0.1", server.port, timeout=WAIT)
        try:
            with pytest.raises(TypeError, match="cannot reconnect"):
                BlockingClient(LineSession(), StreamChannel(sock), timeout=WAIT, reconnect=True)
        finally:
            sock.close()


def test_reconnecting_can_start_after_the_first_steps_and_stop_again(thread):
    time = FakeTime()
    with SubServer(thread) as server:
        client = BlockingSubClient([server.port], time=time, reconnect=None)
        assert not client.reconnecting
        client.set_reconnect(Reconnect(initial=0.5, jitter=0.0))  # as sub does, subscribed
        assert client.ask("SUB a") == "SUB A"
        server.call(server.connections[0].drop)
        # the connection's end is on the wire before the next request (otherwise "b" could
        # be written before the close is seen: a request in flight, which fails)
        server.wait(lambda: server.ended(0))
        assert client.ask("b") == "B"  # reconnected first
        assert server.logged(conn=1) == [b"ASK SUB a", b"ASK b"]
        client.set_reconnect(None)
        server.call(server.connections[1].drop)
        with pytest.raises(LineClosed):
            client.ask("c")
        assert not client.reconnecting
