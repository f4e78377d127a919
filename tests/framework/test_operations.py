"""Operational pieces on their own: the log filter, listener backlogs, heap trimming."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.logger import LogLevel, PredicateResult

from msgbroker import memory
from msgbroker.logs import BrokerLogFilter
from msgbroker.service import with_backlog


def test_log_filter_drops_events_below_the_level():
    info = BrokerLogFilter("info")
    assert info({"log_level": LogLevel.debug}) is PredicateResult.no
    assert info({"log_level": LogLevel.info}) is PredicateResult.maybe
    debug = BrokerLogFilter("debug")
    assert debug({"log_level": LogLevel.debug}) is PredicateResult.maybe
    assert BrokerLogFilter("warn")({"log_level": LogLevel.info}) is PredicateResult.no


def test_log_filter_drops_twisteds_per_listener_lines_only():
    keep = BrokerLogFilter("info")
    for noise in (
        "BrokerFactory starting on 4444",
        "StreamFactory (TLS) starting on 4443",
        "(TLSMemoryBIOFactory Port 4443 Closed)",
        "Starting factory <msgbroker.connection.BrokerFactory object at 0x7f>",
        "Stopping factory <x>",
    ):
        event = {"log_level": LogLevel.info, "message": (noise,), "log_format": "{log_text}"}
        assert keep(event) is PredicateResult.no, noise
    said = {"log_level": LogLevel.info, "message": ("ssmp starting on time",)}
    assert keep(said) is PredicateResult.no  # the shape, not the words: "X starting on Y"
    own = {"log_level": LogLevel.info, "log_text": "ssmp listening on tcp:127.0.0.1:4444"}
    assert keep(own) is PredicateResult.maybe


def test_log_filter_treats_autobahns_per_client_lines_as_debug():
    namespace = "autobahn.twisted.websocket.WebSocketServerProtocol"
    for level in (LogLevel.info, LogLevel.warn):
        event = {"log_level": level, "log_namespace": namespace}
        assert BrokerLogFilter("info")(event) is PredicateResult.no
        assert BrokerLogFilter("debug")(event) is PredicateResult.maybe
    error = {"log_level": LogLevel.error, "log_namespace": namespace}
    assert BrokerLogFilter("info")(error) is PredicateResult.maybe


def test_listeners_get_a_larger_accept_backlog_unless_they_name_one():
    assert with_backlog("tcp:4444:interface=127.0.0.1", 1024) == (
        "tcp:4444:interface=127.0.0.1:backlog=1024"
    )
    assert with_backlog("tcp6:4444", 10) == "tcp6:4444:backlog=10"
    assert with_backlog("unix:/tmp/s", 10) == "unix:/tmp/s:backlog=10"
    assert with_backlog("tcp:4444:backlog=5", 1024) == "tcp:4444:backlog=5"
    assert with_backlog("ssl:4443", 1024) == "ssl:4443"  # not ours to change


def test_trimmer_trims_once_shortly_after_a_large_release():
    clock = Clock()
    trimmer = memory.Trimmer(clock)
    trimmer.released()
    trimmer.released()  # a burst costs one trim
    assert trimmer.trims == 0
    clock.advance(memory.TRIM_DELAY)
    assert trimmer.trims == 1
    for _ in range(memory.CLOSES_PER_TRIM - 1):
        trimmer.closed()
    clock.advance(memory.TRIM_DELAY)
    assert trimmer.trims == 1
    trimmer.closed()  # many small closes add up to a large release
    clock.advance(memory.TRIM_DELAY)
    assert trimmer.trims == 1  # but trims are spaced out
    clock.advance(memory.TRIM_SPACING - 2 * memory.TRIM_DELAY)
    assert trimmer.trims == 2
    trimmer.released()
    trimmer.cancel()
    assert not clock.getDelayedCalls()


def test_trim_and_resident_size_work_on_this_machine():
    assert memory.trim()  # glibc
    assert memory.resident_bytes() > 1 << 20


def test_trimmer_reports_resident_memory_before_and_after():
    clock = Clock()
    reports = []
    trimmer = memory.Trimmer(clock, lambda before, after: reports.append((before, after)))
    trimmer.released()
    clock.advance(memory.TRIM_DELAY)
    ((before, after),) = reports
    assert before > 1 << 20 and after > 1 << 20
