"""``REPORT_DIR/index.html``: summary numbers first, then one section per question, each with
its chart and the head of its table. Self-contained apart from the PNGs beside it (no
scripts, no web fonts), so it opens from a file or any static server.

Written for a person: tables have titles in words (the Parquet name is beside, small),
columns say what they hold, identifiers are printed as they are (no thousands separators),
and a table or chart with nothing in it is one line saying so, not an empty frame.

A report over several nodes (a cluster) gets a section on the nodes first, and a ``node``
column in the sessions table; with one node neither is shown (the Parquet tables have them).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import pyarrow as pa

from .journal_files import SkippedFile

HEAD_ROWS = 15

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 1.5em 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 8em; }
.card b { display: block; font-size: 1.5em; } .card span { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
td, th { border-bottom: 1px solid #eee; padding: 0.25em 0.8em; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
h3 { font-size: 1em; margin: 1.2em 0 0.3em; } h3 small { color: #888; font-weight: normal; }
img { max-width: 100%; border: 1px solid #eee; display: block; } .warn { color: #a40; }
p.none { color: #666; font-style: italic; margin: 0.3em 0 1em; }
"""

#: the section shown first when the journals are several nodes'
NODE_SECTION = (
    "Nodes",
    "messages_per_node.png",
    ("nodes",),
    "Each node's share. Published: messages clients sent to that node (the report counts a "
    "message once, where it was published); received: messages other nodes published that "
    "it delivered to its own clients. Deliveries, sessions and refused logins are the "
    "node's own.",
)
#: section title, chart (or None), tables shown under it, and a sentence of explanation
SECTIONS: tuple[tuple[str, str | None, tuple[str, ...], str], ...] = (
    (
        "Traffic over time",
        "messages_per_minute.png",
        ("protocols", "recipient_protocols"),
        "Messages routed per minute by the sender's protocol; deliveries by the recipient's.",
    ),
    (
        "Topics",
        "top_topics.png",
        ("topics",),
        "Multicast topics by messages; per-minute series of the top ones: tables/topics_by_minute.",
    ),
    (
        "Top talkers",
        None,
        ("top_talkers",),
        "Senders by messages, with their rank by bytes; per-minute series: "
        "tables/senders_by_minute.",
    ),
    (
        "Fan-out",
        "fanout.png",
        ("fanout",),
        "How many deliveries one message made (0: nobody was subscribed).",
    ),
    (
        "Drops and skips",
        None,
        ("kinds", "drops_by_topic"),
        "Dropped: discarded by a slow-consumer policy. Skipped: the recipient's protocol could "
        "not carry the message.",
    ),
    (
        "Sessions",
        "session_durations.png",
        ("sessions",),
        "From open to close. 'open': no close in the journal (still connected, or the broker "
        "stopped); 'partial': opened before the journal or the --since window.",
    ),
    (
        "Authentication failures",
        "auth_failures.png",
        ("auth_failures_by_identity", "auth_failures_by_host"),
        "Refused logins by the identity asked for and by the peer's address.",
    ),
)


#: each table's title in the page, and the line shown instead when it has no rows
TABLE_TITLES: dict[str, tuple[str, str]] = {
    "summary": ("Summary", "No data."),
    "nodes": ("Nodes", "No nodes in this period."),
    "traffic_by_node_minute": ("Messages per minute, by node", "No messages in this period."),
    "kinds": ("Messages by kind", "No messages in this period."),
    "protocols": ("Sent, by the sender's protocol", "No messages in this period."),
    "recipient_protocols": (
        "Delivered, by the recipient's protocol",
        "No deliveries in this period.",
    ),
    "traffic_by_minute": ("Messages per minute", "No messages in this period."),
    "topics": ("Busiest topics", "No multicast messages in this period."),
    "topics_by_minute": ("The top topics, per minute", "No multicast messages in this period."),
    "senders_by_minute": ("Senders, per minute", "No messages in this period."),
    "top_talkers": ("Senders by messages", "No messages in this period."),
    "fanout": ("Messages by number of deliveries", "No messages in this period."),
    "drops_by_topic": ("Topics with drops or skips", "Nothing was dropped or skipped."),
    "auth_failures_by_identity": ("Refused logins by identity", "No refused logins."),
    "auth_failures_by_host": ("Refused logins by peer address", "No refused logins."),
    "sessions": ("Sessions", "No sessions in this period."),
}
#: column headings in words, where the Parquet name is not one (per table, then for all)
COLUMN_LABELS: dict[str, str] = {
    "session_id": "session id",
    "duration_s": "duration (s)",
    "rank_messages": "rank by messages",
    "rank_bytes": "rank by bytes",
    "delivered": "deliveries",
    "protocols": "protocols used",
    "hosts": "peer addresses",
    "identities": "identities tried",
    "host": "peer address",
    "received": "received from other nodes",
    "open_sessions": "still open",
    "auth_failures": "refused logins",
}
TABLE_COLUMN_LABELS: dict[tuple[str, str], str] = {
    ("fanout", "delivered"): "deliveries of one message",
    ("fanout", "messages"): "messages",
    ("nodes", "messages"): "published",
    ("nodes", "received"): "received",
    ("traffic_by_node_minute", "received"): "received",
}
#: columns in the Parquet table but not in the page's, which would be too wide for them
PAGE_HIDDEN: dict[str, tuple[str, ...]] = {"nodes": ("first", "last")}
#: columns that are identifiers, not quantities: printed as they are (no 1,234 grouping)
IDENTIFIER_COLUMNS = frozenset({"session_id"})


def write_index(
    out_dir: Path,
    journal_dir: Path | Sequence[Path],
    tables: dict[str, pa.Table],
    charts: Sequence[Path],
    skipped: Sequence[SkippedFile],
) -> Path:
    """Write index.html into ``out_dir``; charts and tables are linked relative to it.
    ``journal_dir``: the journal directory, or those of several nodes."""
    summary = tables["summary"].to_pylist()[0]
    chart_names = {p.name: p for p in charts}
    journals = [journal_dir] if isinstance(journal_dir, str | Path) else list(journal_dir)
    several = tables["nodes"].num_rows > 1
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>msgbroker journal report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>msgbroker journal report</h1>",
        f'<p class="sub">{escape(", ".join(map(str, journals)))} &middot; '
        f"{escape(_period(summary))} &middot; generated "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC</p>",
        _cards(summary, several),
    ]
    if skipped:
        parts.append(
            f'<p class="warn">{len(skipped)} file(s) in the journal directory were '
            "not journal segments and were skipped:</p><ul>"
        )
        parts.extend(
            f"<li><code>{escape(str(s.path))}</code>: {escape(s.reason)}</li>" for s in skipped
        )
        parts.append("</ul>")
    for title, chart, names, text in (NODE_SECTION, *SECTIONS) if several else SECTIONS:
        parts.append(f"<h2>{escape(title)}</h2>")
        if all(tables[name].num_rows == 0 for name in names):
            # one line for the whole section: no empty chart, no empty tables
            parts.append(f'<p class="none">{escape(TABLE_TITLES[names[0]][1])}</p>')
            continue
        parts.append(f"<p>{escape(text)}</p>")
        if chart is not None and chart in chart_names:
            rel = chart_names[chart].relative_to(out_dir).as_posix()
            parts.append(f'<img src="{escape(rel)}" alt="{escape(title)} (chart)">')
        for name in names:
            table = tables[name]
            if not several and "node" in table.column_names:
                table = table.drop_columns(["node"])  # one node: nothing to tell apart
            table = table.drop_columns(list(PAGE_HIDDEN.get(name, ())))
            parts.append(_table(name, table))
    parts.append("<h2>Tables</h2><p>Every table, in full, as Parquet:</p><ul>")
    parts.extend(
        f'<li><a href="tables/{name}/">tables/{name}/</a>: '
        f"{escape(_title(name))} ({_rows(tables[name].num_rows)})</li>"
        for name in tables
    )
    parts.append("</ul></body></html>")
    index = out_dir / "index.html"
    index.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return index


def _period(summary: dict[str, Any]) -> str:
    first, last = summary["first"], summary["last"]
    if first is None:
        return "no messages"
    return f"{first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC"


def _cards(summary: dict[str, Any], several: bool = False) -> str:
    cards = [("nodes", summary["nodes"])] if several else []
    cards += [
        ("messages", summary["messages"]),
        ("bytes", _bytes(summary["bytes"])),
        ("deliveries", summary["delivered"]),
        ("dropped", summary["dropped"]),
        ("skipped", summary["skipped"]),
        ("topics", summary["topics"]),
        ("senders", summary["senders"]),
        ("sessions", summary["sessions"]),
        ("still open", summary["open_sessions"]),
        ("auth failures", summary["auth_failures"]),
    ]
    if summary["received"]:
        cards.insert(cards.index(("deliveries", summary["delivered"])),
                     ("received from other nodes", summary["received"]))  # fmt: skip
    if summary["skipped_files"]:
        cards.append(("files skipped", summary["skipped_files"]))
    inner = "".join(
        f"<div class=card><b>{escape(_number(v))}</b><span>{escape(k)}</span></div>"
        for k, v in cards
    )
    return f'<div class="cards">{inner}</div>'


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _title(name: str) -> str:
    return TABLE_TITLES.get(name, (name, ""))[0]


def _rows(count: int) -> str:
    return f"{count:,} row" if count == 1 else f"{count:,} rows"


def _label(table: str, column: str) -> str:
    return TABLE_COLUMN_LABELS.get((table, column)) or COLUMN_LABELS.get(column, column)


def _table(name: str, table: pa.Table) -> str:
    """The head of ``table`` under its title in words (its Parquet name beside, small); one
    line instead when it has no rows."""
    title, none = TABLE_TITLES.get(name, (name, "None."))
    more = f", first {HEAD_ROWS} of {table.num_rows:,}" if table.num_rows > HEAD_ROWS else ""
    heading = f"<h3>{escape(title)} <small>tables/{escape(name)}{more}</small></h3>"
    if table.num_rows == 0:
        return f'{heading}<p class="none">{escape(none)}</p>'
    head = table.slice(0, HEAD_ROWS).to_pylist()
    numeric = [
        pa.types.is_integer(field.type) or pa.types.is_floating(field.type)
        for field in table.schema
    ]
    rows = [heading, "<table><tr>"]
    for column, right in zip(table.column_names, numeric, strict=True):
        css = ' class="n"' if right else ""
        rows.append(f"<th{css}>{escape(_label(name, column))}</th>")
    rows.append("</tr>")
    for row in head:
        cells = []
        for column, value in row.items():
            css = ' class="n"' if isinstance(value, int | float) else ""
            cells.append(f"<td{css}>{escape(_cell(column, value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "".join(rows)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "—"
    if column == "node" and value == "":
        return "(unnamed)"  # a journal from before node names
    if column in IDENTIFIER_COLUMNS:
        return str(value)
    if isinstance(value, dt.datetime):
        return f"{value:%Y-%m-%d %H:%M:%S}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    return _number(value)
