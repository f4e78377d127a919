"""The live dashboard in a real headless Chromium: the page loads behind the admin
credential, follows the broker over server-sent events, shows a publish made during the
test; its picture is docs/images/dashboard.png, which docs/operations.md shows, when
``MSGBROKER_DOCS_IMAGES=1`` (tests/browser.py)."""

from __future__ import annotations

import pytest

from msgbroker.plugins.stmp.blocking import BlockingSTMPClient
from tests.admin.support import admin_broker, login
from tests.browser import browser, docs_screenshot  # noqa: F401  (the fixture)
from tests.ssmp.e2e_support import parse_address

pytestmark = pytest.mark.screenshot
LISTENERS = ("ssmp=tcp:0:interface=127.0.0.1", "stmp=tcp:0:interface=127.0.0.1")


def published_cell(topic: str) -> str:
    return f'#topics tr:has(td.topic:text-is("{topic}")) td:nth-child(4)'


def test_the_dashboard_shows_a_publish_live(tmp_path, browser):  # noqa: F811
    with admin_broker(tmp_path, listeners=LISTENERS, sample_seconds=0.25) as ab:
        stmp_host, stmp_port = parse_address(ab.broker.service.broker.listening[1][1])
        reader = login(ab.broker, "dashboard-reader")
        reader.request(b"SUBSCRIBE orders\nSUBSCRIBE prices\n", b"200\n200\n")
        watcher = BlockingSTMPClient(stmp_host, stmp_port, "stmp-watcher")
        watcher.subscribe("prices")
        page = browser(
            f"http://127.0.0.1:{ab.port}/",
            http_credentials={"username": "admin", "password": ab.secret},
        )
        page.wait_for_selector("#status.on")  # the event stream is open
        assert page.title() == "msgbroker"
        assert "version " in page.inner_text("#version")

        # published while the page is open: it shows on the next sample
        writer = login(ab.broker, "dashboard-writer")
        total = {"orders": 0, "prices": 0}
        for step in range(1, 9):
            orders, prices = 10 * step, 40 - 4 * step
            writer.request(
                b"MCAST orders o\n" * orders + b"MCAST prices p\n" * prices,
                b"200\n" * (orders + prices),
            )
            watcher.publish("prices", b"step %d" % step)
            total["orders"] += orders
            total["prices"] += prices + 1
            for topic, count in total.items():
                page.wait_for_selector(
                    f'{published_cell(topic)}:text-is("{count}")', state="attached"
                )
        assert page.inner_text("#tile-connections") == "3"
        page.wait_for_selector('#session-count:text-is("(3)")')  # the list follows
        assert "dashboard-writer" in page.inner_text("#sessions")
        assert "stmp" in page.inner_text("#legend-connections")
        # connections are counted whole: so are the grid lines' labels
        labels = page.locator("#chart-connections text.axis").all_text_contents()
        numbers = [label for label in labels if label[:1].isdigit()]
        assert numbers == ["4", "3", "2", "1", "0"], labels
        assert page.locator("#chart-in polyline").count() >= 2  # ssmp and stmp
        assert docs_screenshot(page, "dashboard.png", tmp_path).stat().st_size > 10_000
        watcher.close()
        writer.close()
        reader.close()
