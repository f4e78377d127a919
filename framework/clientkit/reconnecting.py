"""The Twisted half of reconnecting: :class:`ReconnectingClient` keeps one connection up on
Twisted's ``ClientService`` and, after each loss, puts back what the application had set up
(the session's :meth:`~msgbroker.clientkit.session.ClientSession.replay`: its login and
subscriptions); :func:`connect_reconnecting` is what a protocol's ``connect(...,
reconnect=...)`` returns. The policy and the replay are :mod:`.reconnect`'s, shared with the
blocking driver.

A protocol gives its API on the kept-up connection with a few lines: a subclass of
:class:`ReconnectingClient` and the protocol's request mixin, whose private request methods
go to the live protocol through :meth:`ReconnectingClient._forward` (raise) or
:meth:`ReconnectingClient._forward_deferred` (a failed Deferred) — both fail with the
protocol's ``ConnectionClosed`` while the client is reconnecting: nothing is queued, and a
request in flight when the connection drops fails the same way (at most once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from twisted.application.internet import ClientService
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from .reconnect import Backoff, Reconnect, Replay, gives_up, reconnect_policy, still_to_replay
from .session import ConnectionClosed

__all__ = ["ReconnectingClient", "connect_reconnecting"]


class ReconnectingClient:
    """One connection kept up: connects ``factory``'s protocol through ``endpoint`` (see
    :func:`~msgbroker.clientkit.protocol.client_endpoint`) and prepares each new connection:
    its opening exchange (:meth:`~msgbroker.clientkit.protocol.SessionDriver.when_ready`),
    ``prepare(proto)`` (the login, say), then — after a loss — the lost session's replay
    (its subscriptions, and its login unless ``prepare`` logged in). Between attempts it
    waits as ``reconnect`` says (a :class:`~msgbroker.clientkit.reconnect.Reconnect`;
    ``retry(n)``, seconds before the n-th attempt, overrides its waits). A connection that
    is not restored within ``timeout`` seconds is dropped and tried again. On Twisted's
    ``ClientService``; timers run on ``reactor``.

    ::

        client = ReconnectingClient(reactor, endpoint, SSMPClientFactory(clock=reactor),
                                    prepare=lambda proto: proto.login("alice"))
        client.start()
        proto = yield client.when_connected()
        yield proto.subscribe("news")      # subscribed again after each reconnection

    It gives up — :meth:`when_stopped` fires with the error — when the broker refuses what
    is replayed (a login, a subscription) or the policy's attempts are spent.
    """

    log: ClassVar[Logger] = Logger(namespace="msgbroker.clientkit")

    def __init__(
        self,
        reactor: Any,
        endpoint: Any,
        factory: Any,
        prepare: Callable[[Any], Any] | None = None,
        *,
        retry: Callable[[int], float] | None = None,
        reconnect: Reconnect | bool = True,
        timeout: float | None = 30.0,
    ) -> None:
        self.reactor = reactor
        self.policy = reconnect_policy(reconnect) or Reconnect()
        self.timeout = timeout
        #: the connected, prepared and restored protocol; None while (re)connecting
        self.protocol: Any = None
        self._prepare = prepare
        self._retry = retry
        self._backoff = Backoff(self.policy)
        self._last: Any = None  # the latest protocol, live or not (for its errors)
        self._was_up = False  # a connection was up: the next ones are reconnections
        self._next_wait = 0.0  # the wait after the connection ClientService is losing
        self._disconnected = False  # ClientService is losing a connection (not an attempt)
        self._last_error: BaseException | None = None
        self._ended: BaseException | None = None  # why it stopped (None: running)
        self._waiters: list[list[Any]] = []  # [Deferred, failures left or None]
        self._stop_waiters: list[defer.Deferred[BaseException | None]] = []
        self.service = ClientService(endpoint, factory, retryPolicy=self._delay, clock=reactor)

    # -- for the application -------------------------------------------------------------------

    def start(self) -> None:
        """Start connecting."""
        if not self.service.running and self._ended is None:
            self._await()  # first: a connection that fails at once is one attempt too
            self.service.startService()

    def stop(self) -> defer.Deferred[None]:
        """Stop reconnecting and close the connection (the protocol's goodbye); fires once
        it is closed."""
        return defer.ensureDeferred(self._stop())

    def close(self) -> defer.Deferred[None]:
        """:meth:`stop`."""
        return self.stop()

    @property
    def closed(self) -> bool:
        """Whether it stopped (or gave up)."""
        return self._ended is not None

    def when_connected(self, fail_after_failures: int | None = None) -> defer.Deferred[Any]:
        """The connected, prepared protocol — now, or once there is one; fails after that
        many failed attempts, if given, and when it stops or gives up."""
        if self.protocol is not None:
            return defer.succeed(self.protocol)
        if self._ended is not None:
            return defer.fail(self._not_connected())
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiters.append([d, fail_after_failures])
        return d

    def when_stopped(self) -> defer.Deferred[BaseException | None]:
        """Fires when it stopped: with None after :meth:`stop`, with the error when it
        gave up."""
        if self._ended is not None:
            return defer.succeed(None if isinstance(self._ended, _Stopped) else self._ended)
        d: defer.Deferred[BaseException | None] = defer.Deferred()
        self._stop_waiters.append(d)
        return d

    @property
    def session(self) -> Any:
        """The live protocol's session (the last one's while reconnecting)."""
        proto = self.protocol or self._last
        if proto is None:
            raise ConnectionClosed("not connected yet")
        return proto.session

    # -- for a protocol's subclass ---------------------------------------------------------------

    def _live(self) -> Any:
        """The live protocol; the protocol's ``ConnectionClosed`` while there is none."""
        if self.protocol is None:
            raise self._not_connected()
        return self.protocol

    def _forward(self, call: Callable[[Any], Any]) -> Any:
        """``call(live protocol)``; raises while reconnecting."""
        return call(self._live())

    def _forward_deferred(self, call: Callable[[Any], Any]) -> defer.Deferred[Any]:
        """``call(live protocol)``, a Deferred; a failed one while reconnecting."""
        try:
            proto = self._live()
        except ConnectionClosed as e:
            return defer.fail(e)
        d: defer.Deferred[Any] = call(proto)
        return d

    # -- the loop ------------------------------------------------------------------------------

    def _await(self) -> None:
        """Wait for ClientService's next connection (or failed attempt)."""
        if self._ended is None:
            self.service.whenConnected(failAfterFailures=1).addCallbacks(
                self._connected, self._connect_failed
            )

    def _delay(self, attempt: int) -> float:
        """ClientService's retry policy, asked as it starts waiting: after a connection
        (lost, or not restored: the wait is chosen already), or after a failed attempt to
        connect (which it asks before it tells :meth:`_connect_failed` why)."""
        if self._disconnected:
            self._disconnected = False
            wait = self._next_wait
        else:
            failed = self._backoff.failed()
            if failed is None:
                self.reactor.callLater(0, self._spent)
            wait = self.policy.max_delay if failed is None else failed
        return self._retry(attempt) if self._retry is not None else wait

    def _connect_failed(self, failure: Failure) -> None:
        if self._ended is not None or failure.check(defer.CancelledError):
            return
        error = self._last_error = _error(failure)
        self._fail_waiters(error)
        # not from within ClientService's transition, which is telling us (it refuses)
        self.reactor.callLater(0, self._await)

    def _connected(self, proto: Any) -> None:
        if self._ended is not None:
            return
        self._last = proto
        timer = None
        if self.timeout is not None:
            text = f"not ready within {self.timeout:g} s"
            timer = self.reactor.callLater(
                self.timeout, lambda: proto._abort(proto.session.closed_error(text))
            )
        restoring = defer.ensureDeferred(self._restore(proto))
        restoring.addBoth(_cancel_then, timer)
        restoring.addCallbacks(
            self._restored, self._restore_failed, callbackArgs=(proto,), errbackArgs=(proto,)
        )
        proto.when_closed().addCallback(self._lost, proto)

    async def _restore(self, proto: Any) -> list[Replay]:
        await proto.when_ready()
        if self._prepare is not None:
            await defer.maybeDeferred(self._prepare, proto)
        replay = still_to_replay(self._backoff.replay, proto.session)
        await proto._replay(replay)
        return replay

    def _restored(self, replay: list[Replay], proto: Any) -> None:
        if self._ended is not None or proto.closed:
            return  # its loss is _lost's
        restored = self._backoff.restored(replay, self.reactor.seconds())
        self.protocol = proto
        if self._was_up:
            self.log.info(
                "{client} reconnected ({attempts} attempt(s)), restored: {replayed}",
                client=proto.client_name, attempts=restored.attempts,
                replayed=", ".join(restored.replayed) or "nothing",
            )  # fmt: skip
            self._backoff.tell_restored(restored)
        self._was_up = True
        waiters, self._waiters = self._waiters, []
        for d, _ in waiters:
            d.callback(proto)

    def _restore_failed(self, failure: Failure, proto: Any) -> None:
        if self._ended is not None:
            return
        error = self._last_error = _error(failure)
        if gives_up(error):
            self._give_up(error)
            return
        wait = self._backoff.failed()
        self._fail_waiters(error)
        if wait is None:
            self._spent()
        elif self._ended is None:
            self._next_wait = wait
            proto._abandon()  # ClientService sees the loss and waits, then tries again

    def _lost(self, reason: BaseException, proto: Any) -> None:
        self._disconnected = True
        if proto is self.protocol:
            self.protocol = None
            if self._ended is None:
                replay = proto.session.replay()
                self._next_wait = self._backoff.lost(replay, self.reactor.seconds())
                self.log.info("{client} lost the connection ({reason}); reconnecting",
                              client=proto.client_name, reason=reason)  # fmt: skip
                self._backoff.tell_lost(reason)
        if self._ended is None:
            # after ClientService has seen the loss too (it hears of it right after us)
            self.reactor.callLater(0, self._await)

    def _fail_waiters(self, error: BaseException) -> None:
        """An attempt failed: :meth:`when_connected`'s waiters that counted it fail."""
        for waiter in list(self._waiters):
            d, left = waiter
            if left is not None:
                waiter[1] = left - 1
                if left <= 1:
                    self._waiters.remove(waiter)
                    d.errback(error)

    def _spent(self) -> None:
        """The policy's attempts are spent."""
        if self._ended is None:
            failures, error = self._backoff.failures, self._last_error
            self._give_up(_closed_error(self._last, f"gave up after {failures} attempts: {error}"))

    def _give_up(self, error: BaseException) -> None:
        self.log.info("{client} gave up reconnecting: {error}",
                      client=_name(self._last), error=error)  # fmt: skip
        self._end(error)
        self.reactor.callLater(0, self.service.stopService)

    async def _stop(self) -> None:
        proto = self.protocol
        if self._ended is None:
            self._end(_Stopped())
        if proto is not None and not proto.closed:
            await proto.close()
        await self.service.stopService()

    def _end(self, why: BaseException) -> None:
        self._ended = why
        self.protocol = None
        waiters, self._waiters = self._waiters, []
        for d, _ in waiters:
            d.errback(self._not_connected())
        stopped, self._stop_waiters = self._stop_waiters, []
        for done in stopped:
            done.callback(None if isinstance(why, _Stopped) else why)

    def _not_connected(self) -> BaseException:
        why = self._ended
        if why is None:
            return _closed_error(self._last, "not connected: reconnecting")
        if isinstance(why, _Stopped):
            return _closed_error(self._last, "the client is closed")
        return why


class _Stopped(Exception):
    """Why a client stopped when the application stopped it."""


def _error(failure: Failure) -> BaseException:
    error = failure.value
    assert error is not None
    return error


def _cancel_then(result: Any, timer: Any) -> Any:
    if timer is not None and timer.active():
        timer.cancel()
    return result


def _closed_error(proto: Any, text: str) -> ConnectionClosed:
    closed_error = proto.session.closed_error if proto is not None else ConnectionClosed
    error: ConnectionClosed = closed_error(text)
    return error


def _name(proto: Any) -> str:
    return str(getattr(proto, "client_name", "client"))


def connect_reconnecting(
    reactor: Any,
    endpoint: Any,
    factory: Any,
    prepare: Callable[[Any], Any] | None,
    reconnect: Reconnect | bool,
    client_class: type[ReconnectingClient] = ReconnectingClient,
    timeout: float | None = 30.0,
) -> defer.Deferred[Any]:
    """A started ``client_class`` once its first connection is ready; like a protocol's
    ``connect``, the first attempt's failure (a refused connection or login) fails it,
    and nothing is tried again."""
    client = client_class(
        reactor, endpoint, factory, prepare, reconnect=reconnect, timeout=timeout
    )
    client.start()

    def failed(failure: Failure) -> Failure:
        client._end(_error(failure))
        client.reactor.callLater(0, client.service.stopService)
        return failure

    return client.when_connected(fail_after_failures=1).addCallbacks(
        lambda _: client, failed
    )
