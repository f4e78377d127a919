"""The report's charts: matplotlib (Agg, no display) PNGs drawn from the collected tables.

Each chart is a function of the Arrow tables only, so it draws the same whatever Spark ran
on. An empty table still gets its chart, saying there is nothing to show, so index.html
always has the same sections.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

#: the charts' file names under REPORT_DIR/charts, in the order the report shows them
CHARTS = (
    "messages_per_minute.png",
    "top_topics.png",
    "fanout.png",
    "session_durations.png",
    "auth_failures.png",
)
TOP_BARS = 15

_warming = threading.Lock()


def render_all(tables: dict[str, pa.Table], out_dir: Path) -> list[Path]:
    """Draw every chart into ``out_dir``; returns their paths, in :data:`CHARTS` order.

    Figures are made directly (``matplotlib.figure.Figure`` on the Agg canvas), not through
    pyplot and its global state, so the report can draw them on a thread of their own while
    Spark computes the rest.
    """
    from matplotlib.figure import Figure

    with _warming:  # a preload still running finishes first
        pass
    out_dir.mkdir(parents=True, exist_ok=True)
    drawers: dict[str, Callable[..., None]] = {
        "messages_per_minute.png": _messages_per_minute,
        "top_topics.png": _top_topics,
        "fanout.png": _fanout,
        "session_durations.png": _session_durations,
        "auth_failures.png": _auth_failures,
    }
    paths = []
    for name in CHARTS:
        ncols = 2 if name == "auth_failures.png" else 1
        fig = Figure(figsize=(10, 4.5))
        axes = fig.subplots(1, ncols, squeeze=False)
        drawers[name](tables, *axes[0])
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=90)
        paths.append(path)
    return paths


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


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _messages_per_minute(tables: dict[str, pa.Table], ax: Any) -> None:
    ax.set_title("Messages per minute, by sender protocol")
    rows = tables["traffic_by_minute"].to_pylist()
    if not rows:
        _empty(ax, "messages")
        return
    series: dict[str, tuple[list[Any], list[int]]] = defaultdict(lambda: ([], []))
    for row in rows:
        xs, ys = series[row["protocol"]]
        xs.append(row["minute"])
        ys.append(row["messages"])
    for protocol in sorted(series):
        xs, ys = series[protocol]
        ax.plot(xs, ys, label=protocol, marker="." if len(xs) < 30 else None)
    ax.set_ylabel("messages / minute")
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
    ax.grid(axis="x", alpha=0.3)


def _top_topics(tables: dict[str, pa.Table], ax: Any) -> None:
    topics = tables["topics"].slice(0, TOP_BARS).to_pylist()
    ax.set_title(f"Top {TOP_BARS} topics by messages")
    if not topics:
        _empty(ax, "topics")
        return
    _bars(ax, [str(t["topic"]) for t in topics], [t["messages"] for t in topics], "messages")


def _fanout(tables: dict[str, pa.Table], ax: Any) -> None:
    ax.set_title("Fan-out: deliveries per message")
    rows = tables["fanout"].to_pylist()
    if not rows:
        _empty(ax, "messages")
        return
    delivered = [r["delivered"] for r in rows]
    counts = [r["messages"] for r in rows]
    if len(rows) <= 40:
        ax.bar(delivered, counts, width=0.8, color="tab:green")
    else:  # many distinct fan-outs: bin them
        ax.hist(delivered, bins=40, weights=counts, color="tab:green")
    ax.set_xlabel("deliveries of one message")
    ax.set_ylabel("messages")
    ax.grid(axis="y", alpha=0.3)


def _session_durations(tables: dict[str, pa.Table], ax: Any) -> None:
    sessions = tables["sessions"]
    durations = [d for d in sessions.column("duration_s").to_pylist() if d is not None]
    still_open = sessions.column("state").to_pylist().count("open")
    ax.set_title(f"Session durations ({len(durations)} closed, {still_open} still open)")
    if not durations:
        _empty(ax, "closed sessions")
        return
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
    ax.grid(axis="y", alpha=0.3)


def _auth_failures(tables: dict[str, pa.Table], by_identity: Any, by_host: Any) -> None:
    for ax, name, key in (
        (by_identity, "auth_failures_by_identity", "identity"),
        (by_host, "auth_failures_by_host", "host"),
    ):
        rows = tables[name].slice(0, TOP_BARS).to_pylist()
        ax.set_title(f"Auth failures by {key}")
        if not rows:
            _empty(ax, "auth failures")
            continue
        labels = [("(none)" if r[key] is None else r[key] or "(local)") for r in rows]
        _bars(ax, labels, [r["failures"] for r in rows], "failures")
