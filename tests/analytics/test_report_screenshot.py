"""THE SCREENSHOT TEST of the analytics report: index.html of a report over a journal that
looks like a real broker's, opened in headless Chromium (the ``browser`` fixture of
tests/browser.py: ``browser(url) -> playwright.sync_api.Page``), checked as a person sees it,
and its picture taken: docs/images/report.png, which docs/analytics.md shows, when
``MSGBROKER_DOCS_IMAGES=1`` (tests/browser.py).

The report runs its tasks in this process (tests/analytics/report_page.py): no JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analytics.report_page import (
    FIRST_SESSION_ID,
    local_report,
    write_demo_cluster,
    write_demo_journal,
)
from tests.browser import browser, docs_screenshot  # noqa: F401

pytestmark = pytest.mark.screenshot


def test_the_report_page_in_chromium(browser, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # the page names the journal as given: "journal", not /tmp/...
    report = local_report(write_demo_journal(Path("journal")), tmp_path / "report")
    page = browser(report.index.as_uri())
    page.set_viewport_size({"width": 1200, "height": 900})
    assert page.locator("h1").inner_text() == "msgbroker journal report"
    # every chart is loaded and drawn at its size, none wider than the page's column
    images = page.locator("img")
    assert images.count() == len(report.charts)
    for index in range(images.count()):
        width = images.nth(index).evaluate("img => img.complete ? img.naturalWidth : 0")
        assert width > 500, images.nth(index).get_attribute("src")
        assert images.nth(index).bounding_box()["width"] <= 1100
    # identifiers whole, tables titled in words, and the one empty table a line
    text = page.locator("body").inner_text()
    assert str(FIRST_SESSION_ID) in text
    assert f"{FIRST_SESSION_ID:,}" not in text
    assert "Busiest topics" in text
    assert "Nothing was dropped or skipped." not in text
    shot = docs_screenshot(page, "report.png", tmp_path)
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_nodes_section_of_a_cluster_report_in_chromium(browser, tmp_path, monkeypatch):  # noqa: F811
    """Two nodes' journals: the page opens with the nodes, their share and their chart;
    docs/images/report-nodes.png is the top of it, down to the traffic section."""
    monkeypatch.chdir(tmp_path)
    report = local_report(write_demo_cluster(Path("journal")), tmp_path / "report")
    page = browser(report.index.as_uri())
    page.set_viewport_size({"width": 1200, "height": 900})
    titles = page.locator("h2").all_inner_texts()
    assert titles[:2] == ["Nodes", "Traffic over time"]
    chart = page.locator('img[src="charts/messages_per_node.png"]')
    assert chart.evaluate("img => img.complete ? img.naturalWidth : 0") > 500
    rows = page.locator("table").first.locator("tr")
    assert rows.count() == 3  # the heading and a row per node
    assert "db1:4444" in rows.nth(1).inner_text() and "db2:4444" in rows.nth(2).inner_text()
    bottom = page.locator("h2", has_text="Traffic over time").bounding_box()["y"]
    shot = docs_screenshot(
        page, "report-nodes.png", tmp_path, clip={"x": 0, "y": 0, "width": 1200, "height": bottom}
    )
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
