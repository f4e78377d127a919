"""The example custom server (examples/custom-server): a Broker subclass with subclass
hooks, installed by pip and run as ``twistd auditbroker``, over real sockets."""

from __future__ import annotations

import signal
import socket

import pytest

from msgbroker.plugins.ssmp.blocking import BlockingSSMPClient, SSMPError
from tests.examples.test_linepub import running


@pytest.fixture
def audit(example_venv, tmp_path):
    with running(
        example_venv, tmp_path, "--auth", "open", name="auditbroker", protocols=("ssmp",)
    ) as (ports, log, process):
        yield ports["ssmp"], log, process


def test_admin_topics_are_for_root_only_through_its_subclass_hook(audit):
    port, _, _ = audit
    with BlockingSSMPClient("127.0.0.1", port, "alice") as alice:
        alice.subscribe("news")  # other topics: the hook abstains
        with pytest.raises(SSMPError) as refused:
            alice.subscribe("admin/users")
        assert refused.value.code == 405
    with BlockingSSMPClient("127.0.0.1", port, "root") as root:
        root.subscribe("admin/users")


def test_its_status_line_counts_how_sessions_ended(audit):
    port, log, process = audit
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"LOGIN bob open\nCLOSE\n")
        while sock.recv(4096):  # until the broker closed the connection
            pass
    process.send_signal(signal.SIGUSR1)
    line = log.wait_for(r"status: .*sessions ended: (.*)")
    assert line.group(1).strip() == "close requested 1"
