"""``msgbroker users add|remove|list``: the password from stdin or asked twice on a
terminal (a real pty), the file rewritten atomically with its mode kept."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

from msgbroker.plugins.users.passwords import PasswordFile, verify

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


def users(*args, stdin=""):
    return subprocess.run(
        [MSGBROKER, "users", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_add_reads_the_password_from_stdin_and_creates_a_0600_file(tmp_path):
    path = tmp_path / "users"
    done = users("add", str(path), "alice", stdin="s3cret\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"added alice in {path}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    hashes = PasswordFile.read(str(path)).hashes()
    assert list(hashes) == ["alice"]
    assert verify(hashes["alice"], b"s3cret")  # the line break is not part of it


def test_add_again_changes_the_password_in_place_and_list_and_remove(tmp_path):
    path = tmp_path / "users"
    path.write_text("# ours\n")
    path.chmod(0o640)
    for identity, password in (("alice", "one"), ("bob", "two"), ("alice", "three")):
        assert users("add", str(path), identity, stdin=password).returncode == 0
    hashes = PasswordFile.read(str(path)).hashes()
    assert verify(hashes["alice"], b"three") and verify(hashes["bob"], b"two")
    assert path.read_text().splitlines()[0] == "# ours"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # kept
    listed = users("list", str(path))
    assert (listed.returncode, listed.stdout) == (0, "alice\nbob\n")
    removed = users("remove", str(path), "alice")
    assert removed.returncode == 0
    assert users("list", str(path)).stdout == "bob\n"
    absent = users("remove", str(path), "alice")
    assert absent.returncode == 1
    assert "'alice' is not in" in absent.stderr
    assert sorted(os.listdir(tmp_path)) == ["users"]  # no temporary file left behind


def test_add_refuses_an_empty_password_and_a_bad_identity_and_changes_nothing(tmp_path):
    path = tmp_path / "users"
    empty = users("add", str(path), "alice", stdin="\n")
    assert empty.returncode == 1 and "empty" in empty.stderr
    spaced = users("add", str(path), "al ice", stdin="x\n")
    assert spaced.returncode == 1 and "white space" in spaced.stderr
    assert not path.exists()


def test_a_bad_file_is_one_line_and_status_1(tmp_path):
    path = tmp_path / "users"
    path.write_text("alice:not-a-hash\n")
    listed = users("list", str(path))
    assert listed.returncode == 1
    assert (
        listed.stderr
        == f"msgbroker: error: {path}, line 1: the hash of 'alice' is not an argon2 hash\n"
    )


class Terminal:
    """``msgbroker users add`` on a pseudo-terminal: what it prompts, what we type."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command, with the pty as its terminal
            os.execv(MSGBROKER, [MSGBROKER, "users", *args])
        self.output = b""

    def expect(self, text: bytes, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} in {self.output!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 1024)
                except OSError:  # EIO: the child is gone
                    chunk = b""
                assert chunk, f"ended without {text!r}: {self.output!r}"
                self.output += chunk

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def status(self) -> int:
        try:
            while os.read(self.fd, 1024):
                pass
        except OSError:
            pass
        os.close(self.fd)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def test_on_a_terminal_the_password_is_asked_twice_without_echo(tmp_path):
    path = tmp_path / "users"
    terminal = Terminal("add", str(path), "alice")
    terminal.expect(b"Password: ")
    terminal.type("s3cret")
    terminal.expect(b"Password again: ")
    terminal.type("s3cret")
    assert terminal.status() == 0
    assert b"s3cret" not in terminal.output  # not echoed
    assert verify(PasswordFile.read(str(path)).hashes()["alice"], b"s3cret")


def test_on_a_terminal_two_different_passwords_change_nothing(tmp_path):
    path = tmp_path / "users"
    terminal = Terminal("add", str(path), "alice")
    terminal.expect(b"Password: ")
    terminal.type("s3cret")
    terminal.expect(b"Password again: ")
    terminal.type("secret")
    terminal.expect(b"do not match")
    assert terminal.status() == 1
    assert not path.exists()
