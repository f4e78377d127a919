"""The abuse suite: every test starts its own broker process and attacks it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.abuse.harness import FIGURES, BrokerProcess


@pytest.fixture
def start_broker() -> Iterator[Any]:
    started: list[BrokerProcess] = []

    def start(*options: str) -> BrokerProcess:
        broker = BrokerProcess(*options)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/abuse/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.abuse)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("abuse figures")
    for name, figures in FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(figures)}")
    report = os.environ.get("MSGBROKER_ABUSE_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump(FIGURES, f, indent=2)
