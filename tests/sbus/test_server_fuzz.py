"""Bad input against the real server (hypothesis): whatever a client sends, that client is
either served or disconnected, nobody else notices, and the broker logs no traceback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.logger import globalLogPublisher

from tests.fuzzing import mutated
from tests.sbus.server_support import Bus, running_bus

VALID = [
    b"SUB fz/*",
    b"UNSUB fz/*",
    b"MSG fz/a\0payload",
    b"CMSG !/cred/whoami",
    b"CMSG echo/off",
    b"CMSG blocking/soft/discard",
    b"CMSG order/random",
    b"SUB !/cred////fz",
]
packets = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(VALID),
    st.sampled_from(VALID).flatmap(mutated),
    st.lists(
        st.sampled_from(
            [b"SUB", b"MSG", b"CMSG", b"UNSUB", b" ", b"\0", b"!/cred/", b"*", b"/", b"0"]
        )
    ).map(b"".join),
)


@pytest.fixture(scope="module")
def failures() -> Iterator[list[dict]]:
    """Errors the broker logged (an unhandled exception would be one)."""
    failures: list[dict] = []

    def observe(event: dict) -> None:
        if event.get("log_failure") is not None or event.get("isError"):
            failures.append(event)

    globalLogPublisher.addObserver(observe)
    yield failures
    globalLogPublisher.removeObserver(observe)


@pytest.fixture(scope="module")
def bus(failures: list[dict]) -> Iterator[Bus]:
    with running_bus() as bus:
        yield bus


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(burst=st.lists(packets, min_size=1, max_size=8))
def test_any_packets_leave_the_other_clients_untouched(bus, failures, burst):
    bystander = bus.client()
    bystander.send(b"SUB fz-bystander")
    bystander.sync()
    fuzzer = bus.client()
    for packet in burst:
        try:
            fuzzer.send(packet)
        except (BrokenPipeError, ConnectionResetError):
            break  # disconnected for an earlier packet: as it should be
    bystander.send(b"MSG fz-bystander\0ok")
    bystander.expect(b"MSG fz-bystander\0ok")
    fuzzer.close()
    bystander.close()
    bus.clients.clear()
    assert failures == []
