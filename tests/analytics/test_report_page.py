"""index.html and the charts as a person reads them: identifiers printed whole, tables titled
in words, whole-number ticks on counts, and nothing drawn for what has no data (one line
instead). The report runs its tasks in this process (tests/analytics/report_page.py): no
JVM, so these run without Java."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow as pa
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from msgbroker.analytics import charts, html
from msgbroker.analytics.charts import CHARTS
from msgbroker.analytics.report import TABLES
from tests.analytics.report_page import (
    FIRST_SESSION_ID,
    START,
    local_report,
    write_demo_journal,
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    return local_report(write_demo_journal(root / "journal"), root / "report")


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    root = tmp_path_factory.mktemp("empty")
    (root / "journal").mkdir()
    return local_report(root / "journal", root / "report")


def sections(page: str) -> dict[str, str]:
    """Each ``<h2>`` section's title -> its HTML, up to the next one."""
    parts = re.split(r"<h2>(.*?)</h2>", page)
    return {title: text.strip() for title, text in zip(parts[1::2], parts[2::2], strict=True)}


def test_session_ids_are_printed_whole(demo):
    page = demo.index.read_text()
    assert f'<td class="n">{FIRST_SESSION_ID}</td>' in page
    assert f"{FIRST_SESSION_ID:,}" not in page
    # quantities keep their grouping: over two thousand deliveries
    assert re.search(r"<b>\d,\d{3}</b><span>deliveries</span>", page)


def test_tables_are_titled_in_words_with_the_parquet_name_beside(demo):
    page = demo.index.read_text()
    heading = r"<h3>(.*?) <small>tables/(\w+)(?:, first \d+ of [\d,]+)?</small></h3>"
    shown = {name: title for title, name in re.findall(heading, page)}
    assert shown["topics"] == "Busiest topics"
    assert shown["protocols"] == "Sent, by the sender&#x27;s protocol"
    assert shown["auth_failures_by_host"] == "Refused logins by peer address"
    assert all(title != name for name, title in shown.items())
    assert set(html.TABLE_TITLES) == set(TABLES)
    # column headings in words too
    assert '<th class="n">session id</th>' in page
    assert '<th class="n">duration (s)</th>' in page
    assert "duration_s" not in page


def test_count_axes_have_whole_number_ticks_only(demo):
    """Few messages per delivery count (1 or 2) would get ticks at 0.25, 0.5, ... otherwise."""
    tables = dict(demo.tables)
    tables["fanout"] = pa.table({"delivered": [0, 1, 2], "messages": [1, 2, 1]})
    tables["topics"] = demo.tables["topics"].slice(0, 2)
    checked = 0
    for name in CHARTS:
        figure = charts.figure(name, tables)
        FigureCanvasAgg(figure).draw()
        for ax in figure.axes:
            for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                if label in ("messages", "messages / minute", "sessions", "failures",
                             "deliveries of one message"):  # fmt: skip
                    ticks = axis.get_majorticklocs()
                    assert len(ticks) >= 2, (name, label)
                    assert all(float(t).is_integer() for t in ticks), (name, label, ticks)
                    checked += 1
    assert checked == 7  # y of the series; x of topics; x, y of fan-out; y of durations; 2 x


def test_a_bar_chart_is_as_tall_as_its_bars(demo):
    tables = dict(demo.tables)
    tables["topics"] = demo.tables["topics"].slice(0, 2)
    few = charts.figure("top_topics.png", tables).get_figheight()
    tables["topics"] = demo.tables["topics"]
    assert few < charts.figure("top_topics.png", tables).get_figheight() <= charts.HEIGHT


def test_every_chart_of_a_full_report_is_drawn_and_shown(demo):
    assert [p.name for p in demo.charts] == list(CHARTS)
    page = demo.index.read_text()
    assert re.findall(r'<img src="charts/([^"]+)"', page) == list(CHARTS)
    assert 'class="none"' not in page  # every table has rows


def test_an_empty_journal_is_one_line_per_section_and_no_empty_panel(empty):
    assert empty.charts == ()
    assert list((empty.out_dir / "charts").iterdir()) == []
    page = empty.index.read_text()
    assert "<img" not in page
    assert "<table>" not in page
    found = sections(page)
    assert found.pop("Tables").count("<li>") == len(TABLES)
    assert list(found) == [title for title, *_ in html.SECTIONS]
    for title, text in found.items():
        assert re.fullmatch(r'<p class="none">[^<]+</p>', text), (title, text)
    assert found["Authentication failures"].startswith('<p class="none">No refused logins.')


def test_a_section_without_data_collapses_while_the_others_stay(tmp_path):
    """The demo's refused logins come at 09:07: a report until 09:06 has none, so that
    section is one line and its chart is not drawn (the one an earlier report left in the
    same directory is removed); the other sections stay."""
    journal = write_demo_journal(tmp_path / "journal")
    local_report(journal, tmp_path / "out")
    assert (tmp_path / "out" / "charts" / "auth_failures.png").exists()
    later = local_report(journal, tmp_path / "out", until=START + dt.timedelta(minutes=6))
    assert [p.name for p in later.charts] == [c for c in CHARTS if c != "auth_failures.png"]
    assert not (tmp_path / "out" / "charts" / "auth_failures.png").exists()
    found = sections(later.index.read_text())
    assert found["Authentication failures"].startswith('<p class="none">No refused logins.')
    assert '<img src="charts/messages_per_minute.png"' in found["Traffic over time"]
