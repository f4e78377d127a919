"""Fixtures shared by the STMP client tests (``test_client_twisted_network.py`` and
``test_client_blocking.py``): a :class:`FakeSTMPServer` of their own per test, over TCP or
WebSocket, in the session-wide reactor thread; the real broker; ``target``, either of them.
Modules that define a fixture of the same name (``broker`` and ``pki`` in test_e2e.py, for
instance) use their own, as pytest's module fixtures override these.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.certs import make_pki
from tests.ssmp.e2e_support import ReactorThread, RunningBroker, reactor_thread
from tests.stmp.client_support import (
    FakeSTMPServer,
    Target,
    fake_or_broker,
    server_tls_context,
    stmp_broker,
)


@pytest.fixture(scope="module")
def thread() -> ReactorThread:
    return reactor_thread()


@pytest.fixture(params=["tcp", "ws"])
def server(request, thread) -> Iterator[FakeSTMPServer]:
    with FakeSTMPServer(thread, ws=request.param == "ws") as running:
        yield running


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_context(pki):
    return server_tls_context(pki)


@pytest.fixture
def broker(pki) -> Iterator[RunningBroker]:
    """A broker of its own per test (identities and subscriptions do not carry over)."""
    with stmp_broker(pki) as running:
        yield running


@pytest.fixture(params=["fake-tcp", "fake-ws", "broker-tcp", "broker-ws"])
def target(request, thread) -> Iterator[Target]:
    """The fake server or the real broker, over TCP or WebSocket."""
    with fake_or_broker(request, thread) as chosen:
        yield chosen


@pytest.fixture
def tcp_server() -> Iterator[FakeSTMPServer]:
    with FakeSTMPServer(reactor_thread()) as running:
        yield running


@pytest.fixture
def ws_server() -> Iterator[FakeSTMPServer]:
    with FakeSTMPServer(reactor_thread(), ws=True) as running:
        yield running
