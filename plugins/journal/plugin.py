"""The journal plugin: ``--journal DIR`` (``[journal] directory``) records what the broker
routes, and its sessions. Its options are the ``[journal]`` section (:mod:`.settings`).

Hot-path rule: this module implements only ``msgbroker_register_config_sections``,
``msgbroker_broker_started`` and ``msgbroker_broker_stopped``, so a broker without a journal
binds no observer and pays nothing per message. With a journal configured, the started hook
registers a :class:`Journal` (the observation hooks, as methods) with ``broker.add_plugin``,
which re-binds the broker's hooks; the stopped hook removes it (``broker.remove_plugin``,
re-binding again) and closes the writer (writing what is pending).
No session can open before the started hook runs: listeners accept connections only once
the reactor turns, after the service has started.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

from twisted.logger import Logger

from msgbroker import hookimpl
from msgbroker.auth import Accept
from msgbroker.errors import ConfigError

from . import schema
from .settings import SECTION, journal_settings
from .writer import JournalWriter

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from msgbroker import ConfigSection
    from msgbroker.auth import AuthResult, LoginRequest
    from msgbroker.broker import Broker
    from msgbroker.message import Message, MessageRun, RouteResult
    from msgbroker.session import Session

log = Logger(namespace="msgbroker.journal")

#: the name the active journal is registered under among the broker's plugins; also
#: the ``session.data`` key holding a session's id
ACTIVE = "journal.active"
SESSION_KEY = "journal"


class Journal:
    """The observation hooks of a broker with a journal. Each takes a timestamp and hands a
    tuple to the :class:`JournalWriter`; nothing here touches the disk.

    Session ids count up from the journal's start time in microseconds, so they are
    unique across restarts of the broker on one directory (unless it opened more than one
    session per microsecond on average)."""

    def __init__(self, writer: JournalWriter, first_session_id: int | None = None) -> None:
        self.writer = writer
        start = time.time_ns() // 1000 if first_session_id is None else first_session_id
        self._ids = itertools.count(start)
        # bound once: these run per message
        self._message = writer.message
        self._run = writer.run
        self._session = writer.session

    @hookimpl
    def msgbroker_message_routed(self, message: Message, result: RouteResult) -> None:
        self._message(
            time.time_ns() // 1000,
            message.protocol,
            message.sender,
            message.kind,
            message.topic,
            message.payload,
            result.recipients,
            result.skipped,
            result.dropped,
        )

    @hookimpl
    def msgbroker_run_routed(self, run: MessageRun, result: RouteResult) -> None:
        self._run(
            time.time_ns() // 1000,
            run.protocol,
            run.sender,
            run.kind,
            run.topic,
            run.count,
            run.payloads,
            result.recipients,
            result.dropped,
            run.payload_bytes,
        )

    @hookimpl
    def msgbroker_session_opened(self, session: Session) -> None:
        session_id = next(self._ids)
        session.data[SESSION_KEY] = session_id
        self._session(
            time.time_ns() // 1000,
            schema.OPEN,
            session.protocol,
            session_id,
            None,
            session.host,
            None,
            None,
        )

    @hookimpl
    def msgbroker_session_login(
        self, session: Session, request: LoginRequest, result: AuthResult
    ) -> None:
        if isinstance(result, Accept):
            event, identity, reason = schema.LOGIN, result.identity, None
        else:
            event, identity, reason = schema.AUTH_FAILURE, request.identity, result.reason
        self._session(
            time.time_ns() // 1000,
            event,
            session.protocol,
            session.data.get(SESSION_KEY),
            identity,
            request.host or session.host,
            request.scheme,
            reason,
        )

    @hookimpl
    def msgbroker_session_closed(self, session: Session, reason: str) -> None:
        self._session(
            time.time_ns() // 1000,
            schema.CLOSE,
            session.protocol,
            session.data.get(SESSION_KEY),
            session.identity,
            session.host,
            None,
            session.close_text or str(reason),  # the reason, then what it was about
        )


def active_journal(broker: Broker) -> Journal | None:
    """The broker's running journal, or ``None`` (no journal configured, or not started)."""
    journal = broker.plugins.get(ACTIVE)
    return journal if isinstance(journal, Journal) else None


def _warn(text: str) -> None:
    log.warn("{text}", text=text)


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_broker_started(broker: Broker) -> None:
    settings = journal_settings(broker.config)
    if not settings.directory or active_journal(broker) is not None:
        return
    try:
        writer = JournalWriter(
            settings.directory,
            rotate_seconds=settings.rotate_seconds,
            rotate_bytes=settings.rotate_bytes,
            max_records=settings.max_records,
            keep_payloads=settings.payloads,
            warn=_warn,
        )
    except OSError as e:
        raise ConfigError(f"cannot write the journal in {settings.directory}: {e}") from None
    for path in writer.removed:
        log.info("journal: removed {path}, left by an interrupted write", path=str(path))
    broker.add_plugin(Journal(writer), name=ACTIVE)  # the hub gets its observers now
    log.info(
        "journal writing to {directory}{payloads}",
        directory=settings.directory,
        payloads=" (with payloads)" if settings.payloads else "",
    )


@hookimpl(optionalhook=True)  # the admin plugin's hook: it may be blocked
def msgbroker_collect_metrics(broker: Broker) -> list[Any]:
    """The journal's state for ``/metrics`` (``--admin``): segments and bytes written,
    records written, dropped and failed, and how far it is behind (pending records, and
    the seconds since the last rotation)."""
    journal = active_journal(broker)
    if journal is None:
        return []
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    writer = journal.writer
    return [
        CounterMetricFamily(
            "msgbroker_journal_segments", "Journal segment files written.", value=writer.segments
        ),
        CounterMetricFamily(
            "msgbroker_journal_bytes", "Bytes of journal segments written.",
            value=writer.bytes_written,
        ),
        CounterMetricFamily(
            "msgbroker_journal_records", "Journal records written.", value=writer.written
        ),
        CounterMetricFamily(
            "msgbroker_journal_dropped_records",
            "Journal records dropped: too many were pending.",
            value=writer.dropped,
        ),
        CounterMetricFamily(
            "msgbroker_journal_failed_records",
            "Journal records lost to write errors.",
            value=writer.failed,
        ),
        GaugeMetricFamily(
            "msgbroker_journal_pending_records",
            "Journal records waiting for the next rotation.",
            value=writer.pending,
        ),
        GaugeMetricFamily(
            "msgbroker_journal_lag_seconds",
            "Seconds since the journal last wrote its pending records.",
            value=writer.lag,
        ),
    ]


@hookimpl
def msgbroker_broker_stopped(broker: Broker) -> None:
    journal = active_journal(broker)
    if journal is None:
        return
    broker.remove_plugin(name=ACTIVE)
    journal.writer.close()
