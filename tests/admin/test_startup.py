"""``twistd msgbroker --admin ...`` as an operator starts it: a bad endpoint, a port in use or
an unreadable secret stop it with one line; a good one logs where it listens."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.ssmp.e2e_support import WAIT, twistd_broker, twistd_command

BASE = ("--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open")


def start_fails(tmp_path, *options):
    result = subprocess.run(
        twistd_command(*BASE, *options),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT * 4,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_a_port_in_use_stops_the_broker_with_one_line(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        line = start_fails(tmp_path, "--admin", f"tcp:{port}:interface=127.0.0.1")
        assert f"cannot listen on --admin tcp:{port}:interface=127.0.0.1" in line
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--admin", "nonsense:1"), "bad endpoint in --admin nonsense:1"),
        (
            ("--admin", "tcp:0", "--admin-secret-file", "/nonexistent/secret"),
            "cannot read the admin secret file",
        ),
        (("--admin-sample-seconds", "0"), "admin-sample-seconds must be positive"),
    ],
)
def test_bad_admin_settings_stop_the_broker_with_one_line(tmp_path, options, message):
    assert message in start_fails(tmp_path, *options)


def test_the_admin_endpoint_is_logged(tmp_path):
    secret = tmp_path / "admin.secret"
    secret.write_text("s3cret\n")
    options = (*BASE, "--admin", "tcp:0:interface=127.0.0.1", "--admin-secret-file", str(secret))
    with twistd_broker(tmp_path, *options) as broker:
        broker.log.wait_for(r"admin listening on tcp:127\.0\.0\.1:\d+")


def test_without_admin_nothing_heavy_is_imported():
    """The plugin module is loaded by every broker and every ``msgbroker`` command: the web
    server and prometheus-client come only with ``--admin``."""
    code = (
        "import sys; import msgbroker.plugins.admin.plugin; "
        "from msgbroker.plugins.journal import plugin; "
        "heavy = [m for m in ('prometheus_client', 'twisted.web.server') if m in sys.modules]; "
        "print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
