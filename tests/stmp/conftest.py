"""Fixtures shared by the STMP client tests (``test_client_twisted_network.py`` and
``test_client_blocking.py``): a :class:`FakeServer` of their own per test, over TCP or
WebSocket, in the session-wide reactor thread. The client tests' other fixtures (``thread``,
``server``, ``target``, ``pki``, ``broker``, ``tls_context``) stay in those modules: other
modules here have their own fixtures or helpers of those names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ssmp.e2e_support import reactor_thread
from tests.stmp.client_support import FakeServer


@pytest.fixture
def tcp_server() -> Iterator[FakeServer]:
    with FakeServer(reactor_thread()) as running:
        yield running


@pytest.fixture
def ws_server() -> Iterator[FakeServer]:
    with FakeServer(reactor_thread(), ws=True) as running:
        yield running
