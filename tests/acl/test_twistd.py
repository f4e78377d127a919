"""The ACL in a real ``twistd msgbroker`` process: ``--acl FILE`` and ``[acl] file`` in the
TOML configuration; a bad file at start ends the process with one line and status 2."""

from __future__ import annotations

import socket
import subprocess

from tests.ssmp.e2e_support import WAIT, twistd_broker, twistd_command


def test_a_bad_acl_file_is_a_startup_error(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite chat/\ntopic publish,broadcast x\n")
    done = subprocess.run(
        twistd_command("--listen", "ssmp=tcp:0:interface=127.0.0.1", "--acl", str(acl)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"twistd msgbroker: error: ACL file {acl} line 3: broadcast has no topic: "
        "give it a line of its own\n"
    )


def test_the_acl_from_the_configuration_file(tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite chat/\n")
    config = tmp_path / "broker.toml"
    config.write_text(
        f'listen = ["ssmp=tcp:0:interface=127.0.0.1"]\nauth = ["open"]\n[acl]\nfile = "{acl}"\n'
    )
    with twistd_broker(tmp_path, "--config", str(config)) as broker:
        broker.log.wait_for(rf"ACL: 1 rule from {acl} \(1 user, 0 certificate names")
        with socket.create_connection((broker.host, broker.port), timeout=WAIT) as sock:
            sock.sendall(b"LOGIN alice open\nMCAST chat/a yes\nMCAST news no\n")
            received = b""
            while received.count(b"\n") < 3:
                chunk = sock.recv(4096)
                assert chunk, f"closed after {received!r}"
                received += chunk
        assert received == b"200\n200\n405\n"
        broker.log.wait_for(r"ACL refused ssmp alice \(127\.0\.0\.1\): publish 'news'")
