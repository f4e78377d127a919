"""The journal plugin: ``--journal DIR`` (``[journal] directory``) records what the broker
routes, and its sessions. Its options are the ``[journal]`` section (:mod:`.settings`).

Hot-path rule: this module implements only ``msgbroker_register_config_sections``,
``msgbroker_broker_started`` and ``msgbroker_broker_stopped``, so a broker without a journal
binds no observer and pays nothing per message. With a journal configured, the started hook
registers a :class:`~.recorder.Journal` (the observation hooks, as methods) with
``broker.add_plugin``, which re-binds the broker's hooks; the stopped hook removes it
(``broker.remove_plugin``, re-binding again) and closes the writer (writing what is
pending).
No session can open before the started hook runs: listeners accept connections only once
the reactor turns, after the service has started. The recorder and the writer (and with them
pyarrow) are imported only then: a broker without a journal, and sbusd, never load them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from msgbroker import hookimpl
from msgbroker.errors import ConfigError

from .settings import SECTION, journal_settings

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from twisted.logger import Logger

    from msgbroker import ConfigSection
    from msgbroker.broker import Broker

    from .recorder import Journal


@functools.cache
def _log() -> Logger:
    """The journal's logger, made on first use: the command line loads this module too, and
    needs no Twisted."""
    from twisted.logger import Logger

    return Logger(namespace="msgbroker.journal")


#: the name the active journal is registered under among the broker's plugins
ACTIVE = "journal.active"


def active_journal(broker: Broker) -> Journal | None:
    """The broker's running journal, or ``None`` (no journal configured, or not started)."""
    journal = broker.plugins.get(ACTIVE)
    if journal is None:
        return None
    from .recorder import Journal

    return journal if isinstance(journal, Journal) else None


def _warn(text: str) -> None:
    _log().warn("{text}", text=text)


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_broker_started(broker: Broker) -> None:
    settings = journal_settings(broker.config)
    if not settings.directory or active_journal(broker) is not None:
        return
    # pyarrow, only now: a broker without a journal (or sbusd) never imports it
    from .recorder import Journal
    from .writer import JournalWriter

    try:
        writer = JournalWriter(
            settings.directory,
            node=broker.node_name,
            rotate_seconds=settings.rotate_seconds,
            rotate_bytes=settings.rotate_bytes,
            max_records=settings.max_records,
            keep_payloads=settings.payloads,
            warn=_warn,
        )
    except OSError as e:
        raise ConfigError(f"cannot write the journal in {settings.directory}: {e}") from None
    for path in writer.removed:
        _log().info("journal: removed {path}, left by an interrupted write", path=str(path))
    broker.add_plugin(Journal(writer), name=ACTIVE)  # the hub gets its observers now
    _log().info(
        "journal writing to {directory}{payloads} as node {node}",
        directory=settings.directory,
        payloads=" (with payloads)" if settings.payloads else "",
        node=broker.node_name,
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
