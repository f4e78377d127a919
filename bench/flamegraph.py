"""Collapsed stacks (py-spy's ``--format raw``, what ``run.py --profile`` writes) to an SVG
flame graph, with the standard library only.

    python bench/flamegraph.py profile-mcast16-0.txt -o mcast16.svg [--title T] [--thread reactor]

Each frame is a box as wide as its share of the samples, its callers below it; boxes
narrower than ``--min-width`` percent are left out (with their callees). Hover shows the
function and its share. ``--thread`` keeps the stacks whose thread name (py-spy's first
frame, ``--threads``) contains it; by default the busiest thread.
"""

from __future__ import annotations

import argparse
import html
import re
import zlib
from pathlib import Path

WIDTH = 1200
ROW = 16
FONT = 11


def read_stacks(path: Path, thread: str | None) -> dict[tuple[str, ...], int]:
    stacks: dict[tuple[str, ...], int] = {}
    by_thread: dict[str, dict[tuple[str, ...], int]] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = tuple(stack.split(";"))
        first = frames[0] if frames[0].startswith(("thread", "process")) else ""
        # from the reactor's loop up (twistd's start-up frames are the same for all), one
        # box per function, not per line
        loop = next((i for i, f in enumerate(frames) if f.startswith("ReactorBase.mainLoop")), 0)
        frames = tuple(short(f) for f in frames[loop:])
        group = by_thread.setdefault(first, {})
        group[frames] = group.get(frames, 0) + int(count)
    if not by_thread:
        return stacks
    if thread is None:
        chosen = max(by_thread, key=lambda t: sum(by_thread[t].values()))
        return by_thread[chosen]
    for name, group in by_thread.items():
        if thread in name:
            for frames, count in group.items():
                stacks[frames] = stacks.get(frames, 0) + count
    return stacks


def build_tree(stacks: dict[tuple[str, ...], int]) -> dict:
    root: dict = {"name": "all", "value": 0, "children": {}}
    for frames, count in stacks.items():
        root["value"] += count
        node = root
        for frame in frames:
            child = node["children"].get(frame)
            if child is None:
                child = node["children"][frame] = {"name": frame, "value": 0, "children": {}}
            child["value"] += count
            node = child
    return root


def short(frame: str) -> str:
    """``function (path/to/module.py:123)`` -> ``function (module.py)``."""
    return re.sub(r"\(([^()]*/)?([^/():]+)(:\d+)?\)$", r"(\2)", frame)


def colour(name: str) -> str:
    h = zlib.crc32(name.encode())
    if "msgbroker" in name:
        return f"rgb({200 + h % 55},{100 + h % 80},{40 + h % 40})"  # ours: orange
    if "twisted" in name:
        return f"rgb({60 + h % 40},{130 + h % 60},{200 + h % 55})"  # Twisted: blue
    return f"rgb({180 + h % 60},{180 + h % 60},{60 + h % 50})"  # the rest: yellow


def render(root: dict, title: str, min_width: float) -> str:
    total = root["value"] or 1
    boxes: list[str] = []
    depth_max = 0

    def walk(node: dict, x: float, depth: int) -> None:
        nonlocal depth_max
        width = node["value"] / total * WIDTH
        if width < min_width / 100 * WIDTH:
            return
        depth_max = max(depth_max, depth)
        name = node["name"]
        share = 100 * node["value"] / total
        label = name if width > 7 * len(name) * 0.6 else name[: int(width / (0.6 * 7))]
        boxes.append(
            f'<g><title>{html.escape(name)}: {share:.1f}% ({node["value"]} samples)</title>'
            f'<rect x="{x:.1f}" y="{{y{depth}}}" width="{max(width - 0.5, 0.1):.1f}" '
            f'height="{ROW - 1}" fill="{colour(node["name"])}"/>'
            f'<text x="{x + 2:.1f}" y="{{t{depth}}}">{html.escape(label)}</text></g>'
        )
        child_x = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            walk(child, child_x, depth + 1)
            child_x += child["value"] / total * WIDTH

    walk(root, 0.0, 0)
    height = (depth_max + 1) * ROW + 40
    out = "\n".join(boxes)
    for depth in range(depth_max + 1):  # the root at the bottom, callees above
        y = height - 10 - (depth + 1) * ROW
        out = out.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + ROW - 4))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="4" y="16" font-size="14">{html.escape(title)} ({total} samples)</text>'
        f"{out}</svg>\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("raw", type=Path, help="collapsed stacks (py-spy --format raw)")
    p.add_argument("-o", "--out", type=Path, required=True, help="the SVG to write")
    p.add_argument("--title", default=None)
    p.add_argument("--thread", default=None, help="keep the stacks of this thread")
    p.add_argument("--min-width", type=float, default=0.3, help="percent [0.3]")
    args = p.parse_args()
    stacks = read_stacks(args.raw, args.thread)
    args.out.write_text(render(build_tree(stacks), args.title or args.raw.name, args.min_width))
    print(f"{args.out}: {sum(stacks.values())} samples")


if __name__ == "__main__":
    main()
