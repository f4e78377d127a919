"""What runs while ``--admin`` is on: :class:`Admin`, the admin endpoint of one broker (its
web site, sampler, ``_sys`` publisher and metrics registry). Imported only when the
endpoint starts (:mod:`.plugin`), so a broker without it, and every ``msgbroker`` command,
never loads twisted.web or prometheus-client."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from twisted.internet.endpoints import serverFromString
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.server import Site

from msgbroker import hookimpl
from msgbroker.errors import ConfigError
from msgbroker.reasons import CloseReason
from msgbroker.service import describe_address

from .api import KICK_DETAIL
from .metrics import BrokerCollector, registry_for
from .sampler import Sampler
from .settings import ACTIVE, AdminSettings
from .systopics import SysPublisher
from .web import Root

if TYPE_CHECKING:
    from collections.abc import Callable

    from msgbroker.broker import Broker
    from msgbroker.session import Session

log = Logger(namespace="msgbroker.admin")

#: samples the dashboard gets when it opens (its charts' width)
HISTORY = 120


def broker_version() -> str:
    try:
        return version("msgbroker")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class Admin:
    """The admin endpoint of one running broker."""

    def __init__(self, broker: Broker, settings: AdminSettings, secret: bytes | None) -> None:
        self.broker = broker
        self.settings = settings
        self.secret = secret
        self.version = broker_version()
        self.sampler = Sampler(broker, settings.top_topics, HISTORY)
        self.sys = SysPublisher(broker, self.version)
        self.registry = registry_for(
            BrokerCollector(broker, self.sampler, self.sys, self.version)
        )
        self.root = Root(self)
        self.site = Site(self.root)
        self.site.noisy = False
        self.site.log = _no_access_log  # type: ignore[method-assign]
        self.port: Any = None
        #: where it listens, as the log says it (``tcp:127.0.0.1:8090``)
        self.address = ""
        self._loops: list[LoopingCall] = []

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        """Listen (synchronously: a bind error is a :class:`ConfigError`) and start sampling
        and publishing."""
        endpoint_text = self.settings.endpoint
        try:
            endpoint = serverFromString(self.broker.reactor, endpoint_text)
        except Exception as e:
            raise ConfigError(f"bad endpoint in --admin {endpoint_text}: {e}") from None
        outcome: list[Any] = []
        endpoint.listen(self.site).addBoth(outcome.append)
        if not outcome or isinstance(outcome[0], Failure):
            why = outcome[0].getErrorMessage() if outcome else "it did not bind at once"
            raise ConfigError(f"cannot listen on --admin {endpoint_text}: {why}")
        self.port = outcome[0]
        self.address = describe_address(self.port.getHost())
        log.info("admin listening on {address}", address=self.address)
        if self.secret is None:
            log.warn(
                "admin: no --admin-secret-file, so the API and the dashboard are off; "
                "/metrics is served"
            )
        self.sampler.sample()
        self._every(self.settings.sample_seconds, self.tick, now=False)
        if self.settings.sys_interval:
            self._every(self.settings.sys_interval, self.publish_sys, now=True)

    def reconfigure(self, settings: AdminSettings, secret: bytes | None) -> None:
        """Take reloaded settings: the credential, ``metrics-auth``, the ranking and the
        intervals (the periodic tasks restart when one changed). The endpoint stays the one
        it listens on; a new one is logged as waiting for the next start."""
        old, self.settings = self.settings, settings
        self.secret = secret
        self.sampler.top = settings.top_topics
        if settings.endpoint != old.endpoint:
            log.info(
                "admin: the endpoint {endpoint} takes effect at the next start; still on "
                "{address}",
                endpoint=settings.endpoint or "(none)",
                address=self.address,
            )
        if (settings.sample_seconds, settings.sys_interval) != (
            old.sample_seconds,
            old.sys_interval,
        ):
            self._stop_loops()
            self._every(settings.sample_seconds, self.tick, now=False)
            if settings.sys_interval:
                self._every(settings.sys_interval, self.publish_sys, now=True)

    def _stop_loops(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []

    def _every(self, seconds: float, call: Callable[[], None], now: bool) -> None:
        loop = LoopingCall(call)
        loop.clock = self.broker.reactor
        loop.start(seconds, now=now).addErrback(
            lambda failure: log.failure("admin: a periodic task failed", failure)
        )
        self._loops.append(loop)

    def tick(self) -> None:
        """Sample the broker; tell the dashboards."""
        self.root.events.send(self.sampler.sample())

    def publish_sys(self) -> None:
        sample = self.sampler.latest
        if sample is not None:
            self.sys.publish(sample)

    def stop(self) -> None:
        self._stop_loops()
        self.root.events.close_all()
        if self.port is not None:
            port, self.port = self.port, None
            port.stopListening()
            log.info("admin stopped listening on {address}", address=self.address)

    # -- what the API does -------------------------------------------------------------------

    def kick(self, session: Session) -> None:
        """Close ``session`` (``kicked: by the admin API``)."""
        log.info(
            "admin: kicked {protocol} session {id} ({identity}, {host})",
            protocol=session.protocol,
            id=session.id,
            identity=session.identity or "-",
            host=session.host or "local",
        )
        session.close(CloseReason.KICKED, KICK_DETAIL)
        self.broker.batcher.flush()

    def info(self) -> dict[str, Any]:
        broker = self.broker
        now = broker.reactor.seconds()
        return {
            "version": self.version,
            "node": broker.node_name,
            "uptime": now - broker.started_at,
            "started_at": broker.started_at,
            "listeners": [
                {"protocol": listener.protocol, "endpoint": listener.endpoint, "address": address}
                for listener, address in broker.listening
            ],
            "plugins": [name for name in broker.plugins.names() if name != ACTIVE],
            "protocols": sorted(broker.protocols),
            "admin": {
                "address": self.address,
                "sys_interval": self.settings.sys_interval,
                "sample_seconds": self.settings.sample_seconds,
                "top_topics": self.settings.top_topics,
            },
            "slow_closed": list(self.sampler.slow_closed),
        }

    # -- the one hook it observes while it runs -------------------------------------------------

    @hookimpl
    def msgbroker_session_closed(self, session: Session, reason: str) -> None:
        if reason == CloseReason.SLOW_CONSUMER:
            self.sampler.slow_closed.append(
                {
                    "at": self.broker.reactor.seconds(),
                    "id": session.id,
                    "identity": session.identity,
                    "protocol": session.protocol,
                    "host": session.host,
                    "dropped": session.dropped,
                }
            )


def _no_access_log(request: Any) -> None:
    """No access log line per request (a scrape a second would fill the log)."""
