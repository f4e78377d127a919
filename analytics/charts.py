"""The report's charts: matplotlib (Agg, no display) PNGs drawn from the collected tables.

Each chart is a function of the Arrow tables only, so it draws the same whatever Spark ran
on. A chart whose tables are empty is not drawn (index.html says "no data" in one line
instead of a full-width empty panel). Counts are whole numbers, so their axes get integer
ticks only; bar charts are as tall as their bars need.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the charts' file names under REPORT_DIR/charts, in the order the report shows them
CHARTS = (
    "messages_per_minute.png",
    "top_topics.png",
    "fanout.png",
    "session_durations.png",
    "auth_failures.png",
)
#: charts of a report over several nodes only (a cluster's journals)
NODE_CHARTS = ("messages_per_node.png",)
#: the table whose rows each chart draws: no rows, no chart
CHART_TABLES = {
    "messages_per_node.png": "traffic_by_node_minute",
    "messages_per_minute.png": "traffic_by_minute",
    "top_topics.png": "topics",
    "fanout.png": "fanout",
    "session_durations.png": "sessions",
    "auth_failures.png": "auth_failures_by_identity",
}
TOP_BARS = 15
WIDTH = 10  # inches, at 90 dpi: 900 pixels, the report's column
HEIGHT = 4.5

_warming = threading.Lock()


def has_data(name: str, tables: dict[str, pa.Table]) -> bool:
    """Whether chart ``name`` has anything to draw. Sessions: only closed ones have a
    duration."""
    table = tables[CHART_TABLES[name]]
    rows: int = table.num_rows
    if name == "messages_per_node.png":  # one node: the traffic chart says it all
        return len(set(table.column("node").to_pylist())) > 1
    if name == "session_durations.png":
        missing: int = table.column("duration_s").null_count
        return missing < rows
    return rows > 0


def render_all(tables: dict[str, pa.Table], out_dir: Path) -> list[Path]:
    """Draw every chart that has data into ``out_dir``; returns their paths, in
    :data:`CHARTS` order (then :data:`NODE_CHARTS`). A chart without data is not drawn
    (and a file of that name left by an earlier report in ``out_dir`` is removed).

    Figures are made directly (``matplotlib.figure.Figure`` on the Agg canvas), not through
    pyplot and its global state, so the report can draw them on a thread of their own while
    Spark computes the rest.
    """
    with _warming:  # a preload still running finishes first
        pass
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (*CHARTS, *NODE_CHARTS):
        path = out_dir / name
        if not has_data(name, tables):
            path.unlink(missing_ok=True)
            continue
        figure(name, tables).savefig(path, dpi=90)
        paths.append(path)
    return paths


def figure(name: str, tables: dict[str, pa.Table]) -> Figure:
    """Chart ``name`` drawn from ``tables`` (which must have data for it: :func:`has_data`),
    as a figure on no canvas yet."""
    from matplotlib.figure import Figure

    ncols = 2 if name == "auth_failures.png" else 1
    fig = Figure(figsize=(WIDTH, _height(name, tables)))
    axes = fig.subplots(1, ncols, squeeze=False)
    _DRAWERS[name](tables, *axes[0])
    fig.tight_layout()
    return fig


def _height(name: str, tables: dict[str, pa.Table]) -> float:
    """A bar chart is as tall as its bars (three bars need no 4.5 inches); the rest 4.5."""
    bars: int
    if name == "top_topics.png":
        bars = min(TOP_BARS, tables["topics"].num_rows)
    elif name == "auth_failures.png":
        by_identity, by_host = tables["auth_failures_by_identity"], tables["auth_failures_by_host"]
        bars = min(TOP_BARS, max(by_identity.num_rows, by_host.num_rows))
    else:
        return HEIGHT
    return min(HEIGHT, 1.3 + 0.3 * bars)


def preload() -> None:
    """Import what drawing needs and load its font (a second or so), e.g. on a thread while
    the JVM starts; :func:`render_all` waits for it to finish."""
    with _warming:
        import matplotlib.dates  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(1, 1))
        figure.subplots().set_title("font")
        FigureCanvasAgg(figure).draw()


def _whole(axis: Any) -> None:
    """Ticks at whole numbers only: the axis counts messages, sessions or failures."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _messages_per_minute(tables: dict[str, pa.Table], ax: Any) -> None:
    ax.set_title("Messages per minute, by sender protocol")
    rows = tables["traffic_by_minute"].to_pylist()
    series: dict[str, tuple[list[Any], list[int]]] = defaultdict(lambda: ([], []))
    for row in rows:
        xs, ys = series[row["protocol"]]
        xs.append(row["minute"])
        ys.append(row["messages"])
    _minute_lines(ax, series, "messages / minute")


def _messages_per_node(tables: dict[str, pa.Table], ax: Any) -> None:
    ax.set_title("Messages per minute, by node: published there, and received from others")
    rows = tables["traffic_by_node_minute"].to_pylist()
    nodes = sorted({row["node"] for row in rows})
    for index, node in enumerate(nodes):
        color = f"C{index % 10}"
        mine = [row for row in rows if row["node"] == node]
        for column, style, what in (("messages", "-", "published"), ("received", "--", "received")):
            xs = [row["minute"] for row in mine]
            ys = [row[column] for row in mine]
            if any(ys):
                label = f"{node or '(unnamed)'} {what}"
                marker = "." if len(xs) < 30 else None
                ax.plot(xs, ys, style, color=color, label=label, marker=marker)
    _minute_axes(ax, "messages / minute")


def _minute_lines(ax: Any, series: dict[str, tuple[list[Any], list[int]]], ylabel: str) -> None:
    """One line per series over UTC minutes, the series named in the legend."""
    for label in sorted(series):
        xs, ys = series[label]
        ax.plot(xs, ys, label=label, marker="." if len(xs) < 30 else None)
    _minute_axes(ax, ylabel)


def _minute_axes(ax: Any, ylabel: str) -> None:
    """Counts over UTC minutes: whole-number ticks, dates as concise as they can be."""
    ax.set_ylabel(ylabel)
    _whole(ax.yaxis)
    ax.set_xlabel("time (UTC)")
    ax.legend()
    ax.grid(alpha=0.3)
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _bars(ax: Any, labels: list[str], values: list[int], xlabel: str) -> None:
    positions = range(len(labels))
    ax.barh(positions, values, color="tab:blue")
    ax.set_yticks(list(positions), labels)
    ax.invert_yaxis()  # the largest on top
    ax.set_xlabel(xlabel)
    _whole(ax.xaxis)
    ax.grid(axis="x", alpha=0.3)


def _top_topics(tables: dict[str, pa.Table], ax: Any) -> None:
    topics = tables["topics"].slice(0, TOP_BARS).to_pylist()
    ax.set_title(
        f"Top {TOP_BARS} topics by messages" if len(topics) == TOP_BARS else "Topics by messages"
    )
    _bars(ax, [str(t["topic"]) for t in topics], [t["messages"] for t in topics], "messages")


def _fanout(tables: dict[str, pa.Table], ax: Any) -> None:
    ax.set_title("Fan-out: deliveries per message")
    rows = tables["fanout"].to_pylist()
    delivered = [r["delivered"] for r in rows]
    counts = [r["messages"] for r in rows]
    if len(rows) <= 40:
        ax.bar(delivered, counts, width=0.8, color="tab:green")
    else:  # many distinct fan-outs: bin them
        ax.hist(delivered, bins=40, weights=counts, color="tab:green")
    ax.set_xlabel("deliveries of one message")
    ax.set_ylabel("messages")
    _whole(ax.xaxis)
    _whole(ax.yaxis)
    ax.grid(axis="y", alpha=0.3)


def _session_durations(tables: dict[str, pa.Table], ax: Any) -> None:
    sessions = tables["sessions"]
    durations = [d for d in sessions.column("duration_s").to_pylist() if d is not None]
    still_open = sessions.column("state").to_pylist().count("open")
    ax.set_title(f"Session durations ({len(durations)} closed, {still_open} still open)")
    import numpy as np

    low, high = max(min(durations), 1e-3), max(*durations, 1e-3)
    if high / low > 100:  # session lengths are heavy-tailed: bins of equal ratio, log axis
        ax.hist(
            [max(d, 1e-3) for d in durations], bins=np.geomspace(low, high, 41), color="tab:purple"
        )
        ax.set_xscale("log")
    else:
        ax.hist(durations, bins=min(40, max(5, len(durations))), color="tab:purple")
    ax.set_xlabel("seconds from open to close")
    ax.set_ylabel("sessions")
    _whole(ax.yaxis)
    ax.grid(axis="y", alpha=0.3)


def _auth_failures(tables: dict[str, pa.Table], by_identity: Any, by_host: Any) -> None:
    for ax, name, key, what in (
        (by_identity, "auth_failures_by_identity", "identity", "identity asked for"),
        (by_host, "auth_failures_by_host", "host", "peer address"),
    ):
        rows = tables[name].slice(0, TOP_BARS).to_pylist()
        ax.set_title(f"Refused logins by {what}")
        labels = [("(none)" if r[key] is None else r[key] or "(local)") for r in rows]
        _bars(ax, labels, [r["failures"] for r in rows], "failures")


_DRAWERS: dict[str, Callable[..., None]] = {
    "messages_per_node.png": _messages_per_node,
    "messages_per_minute.png": _messages_per_minute,
    "top_topics.png": _top_topics,
    "fanout.png": _fanout,
    "session_durations.png": _session_durations,
    "auth_failures.png": _auth_failures,
}
