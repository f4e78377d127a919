"""``msgbroker_collect_metrics``: plugins add their families to ``/metrics`` (the journal
reports its state through it)."""

from __future__ import annotations

from tests.admin.support import admin_broker, login, value


def test_a_plugin_adds_families_through_msgbroker_collect_metrics(tmp_path):
    with admin_broker(tmp_path, config={"plugins": ("tests.admin.metrics_plugin",)}) as ab:
        client = login(ab.broker, "someone")
        metrics = ab.metrics()
        assert value(metrics["msgbroker_example_sessions_plus_41"]) == 42
        client.close()


def test_the_journal_reports_segments_bytes_and_lag(tmp_path):
    journal = {"journal": {"directory": str(tmp_path / "journal"), "rotate_seconds": 0.2}}
    with admin_broker(tmp_path, sections=journal) as ab:
        client = login(ab.broker, "writer")
        client.request(b"MCAST t one\n")

        def written():
            metrics = ab.metrics()
            segments = value(metrics["msgbroker_journal_segments"])
            return metrics if segments and segments >= 1 else None

        metrics = ab.poll(written, what="a journal segment written")
        assert value(metrics["msgbroker_journal_bytes"]) > 0
        assert value(metrics["msgbroker_journal_records"]) >= 1
        assert value(metrics["msgbroker_journal_dropped_records"]) == 0
        assert value(metrics["msgbroker_journal_pending_records"]) >= 0
        assert 0 <= value(metrics["msgbroker_journal_lag_seconds"]) < 60
        client.close()
