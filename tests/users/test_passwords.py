"""The password file: its format (identity:argon2id lines, comments kept), hashing, and
the atomic rewrite ``msgbroker users`` does."""

from __future__ import annotations

import os
import stat

import pytest

from msgbroker.errors import ConfigError
from msgbroker.plugins.users.passwords import (
    Entry,
    PasswordFile,
    check_identity,
    hash_password,
    verify,
    write_atomically,
)

HASH = hash_password(b"s3cret")


def test_a_hash_is_argon2id_with_a_salt_and_verifies_only_its_password():
    assert HASH.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert hash_password(b"s3cret") != HASH  # a fresh salt each time
    assert verify(HASH, b"s3cret")
    assert not verify(HASH, b"s3cret ")
    assert not verify("$argon2id$nonsense", b"s3cret")


def test_the_file_reads_identities_and_hashes_and_keeps_comments_in_place():
    text = f"# users of the broker\n\nalice:{HASH}\nsvc:queue:{HASH}\n"
    users = PasswordFile.parse(text)
    assert users.identities() == ["alice", "svc:queue"]  # split at the last colon
    assert users.hashes() == {"alice": HASH, "svc:queue": HASH}
    assert users.text() == text
    changed, new = users.with_user("alice", "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA")
    assert not new
    assert changed.text().splitlines()[2].startswith("alice:$argon2id$v=19$m=8,")
    added, new = changed.with_user("bob", HASH)
    assert new and added.identities() == ["alice", "svc:queue", "bob"]
    removed, found = added.without_user("svc:queue")
    assert found and removed.identities() == ["alice", "bob"]
    assert removed.text().startswith("# users of the broker\n\n")
    assert removed.without_user("nobody") == (removed, False)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("alice", "expected identity:hash"),
        (f"al ice:{HASH}", "white space"),
        (f":{HASH}", "cannot be empty"),
        ("alice:$2b$12$abcdefghijklmnopqrstuu", "not an argon2 hash"),
        ("alice:$argon2id$garbage", "not an argon2 hash"),
        (f"alice\x07:{HASH}", "control characters"),
    ],
)
def test_a_bad_line_is_refused_naming_the_file_and_line(line, problem):
    with pytest.raises(ConfigError, match=rf"users\.txt, line 2: .*{problem}"):
        PasswordFile.parse(f"# ok\n{line}\n", "users.txt")


def test_an_identity_twice_is_refused():
    with pytest.raises(ConfigError, match=r"line 2: 'alice' is there twice"):
        PasswordFile.parse(f"alice:{HASH}\nalice:{HASH}\n", "f")


def test_identities_the_file_cannot_hold():
    for bad in ("", "#alice", "a b", "a\tb", "a\nb"):
        with pytest.raises(ValueError):
            check_identity(bad)
    assert check_identity("émile@example.org/1") == "émile@example.org/1"


def test_reading_a_missing_or_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        PasswordFile.read(str(tmp_path / "none"))
    assert PasswordFile.read(str(tmp_path / "none"), missing_ok=True) == PasswordFile()
    (tmp_path / "latin1").write_bytes(b"\xe9mile:x\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        PasswordFile.read(str(tmp_path / "latin1"))


def test_an_atomic_write_creates_0600_and_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "users"
    write_atomically(str(path), "a\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "a\n"
    path.chmod(0o640)
    inode = path.stat().st_ino
    write_atomically(str(path), "b\n")
    assert path.read_text() == "b\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert sorted(os.listdir(tmp_path)) == ["users"]  # no temporary file left


def test_a_write_that_fails_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "users"
    path.write_text("old\n")

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        write_atomically(str(path), "new\n")
    assert path.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["users"]


def test_entries_are_values():
    assert Entry("a", HASH) == Entry("a", HASH)
