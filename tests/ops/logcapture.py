"""Capturing what the broker logs in this process: the events Twisted's global log
publisher sees, as (level name, text, event)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from twisted.logger import formatEvent, globalLogPublisher


class Captured(list[tuple[str, str, dict[str, Any]]]):
    def texts(self, level: str | None = None) -> list[str]:
        return [text for name, text, _ in self if level is None or name == level]


@contextlib.contextmanager
def captured_log() -> Iterator[Captured]:
    events = Captured()

    def observe(event: dict[str, Any]) -> None:
        events.append((event["log_level"].name, formatEvent(event), event))

    globalLogPublisher.addObserver(observe)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(observe)
