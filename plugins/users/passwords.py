"""The password file, as ``--users FILE`` reads it and ``msgbroker users`` writes it: no
Twisted, no broker.

One user per line, ``identity:hash``, the hash an argon2id string (argon2-cffi's, with its
parameters and salt: ``$argon2id$v=19$m=19456,t=2,p=1$...$...``); blank lines and lines
starting with ``#`` are comments, kept as they are when the file is rewritten. The identity
is everything before the last ``:`` (a hash has none), so identities may hold ``:``; it may
not be empty, start with ``#``, or hold white space or control characters. The file is
UTF-8.

Rewriting is atomic, like ``mosquitto_passwd``: a temporary file in the same directory,
written and flushed to disk, given the old file's mode (``0600`` for a new one) and owner
(when allowed), then renamed over the file: a broker reading it (SIGHUP) sees the old
file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator

from argon2 import PasswordHasher, Type, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from attrs import frozen

from msgbroker.errors import ConfigError

#: argon2id with OWASP's first recommended profile (19 MiB, two passes, one lane): about
#: 20-40 ms a hash on a server core, and 19 MiB of memory while it runs
HASHER = PasswordHasher(
    time_cost=2, memory_cost=19_456, parallelism=1, hash_len=32, salt_len=16, type=Type.ID
)
#: a new password file's mode: only its owner (the broker's user) may read it
NEW_FILE_MODE = 0o600


class PasswordFileError(ConfigError):
    """The password file cannot be read or used (one line, naming the file)."""


@frozen
class Entry:
    """One user of the file."""

    identity: str
    hash: str


def check_identity(identity: str) -> str:
    """``identity`` if a password file can hold it; ValueError saying why not."""
    if not identity:
        raise ValueError("an identity cannot be empty")
    if identity.startswith("#"):
        raise ValueError(f"an identity cannot start with '#' (a comment): {identity!r}")
    if any(char.isspace() or not char.isprintable() for char in identity):
        raise ValueError(f"an identity cannot hold white space or control characters: {identity!r}")
    return identity


def parse_line(line: str) -> Entry | None:
    """The entry on ``line`` (without its line break), None for a comment or blank line;
    ValueError saying what is wrong."""
    if not line.strip() or line.startswith("#"):
        return None
    identity, colon, hashed = line.rpartition(":")
    if not colon:
        raise ValueError("expected identity:hash")
    check_identity(identity)
    try:
        extract_parameters(hashed)
    except InvalidHashError:
        raise ValueError(f"the hash of {identity!r} is not an argon2 hash") from None
    return Entry(identity, hashed)


@frozen
class PasswordFile:
    """A password file's lines, as read: each a comment (``str``) or an :class:`Entry`."""

    lines: tuple[str | Entry, ...] = ()

    @classmethod
    def parse(cls, text: str, path: str = "the password file") -> PasswordFile:
        """``text`` read; :class:`PasswordFileError` naming ``path`` and the line."""
        lines: list[str | Entry] = []
        seen: set[str] = set()
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = parse_line(line)
            except ValueError as e:
                raise PasswordFileError(f"{path}, line {number}: {e}") from None
            if entry is None:
                lines.append(line)
                continue
            if entry.identity in seen:
                raise PasswordFileError(f"{path}, line {number}: {entry.identity!r} is there twice")
            seen.add(entry.identity)
            lines.append(entry)
        return cls(tuple(lines))

    @classmethod
    def read(cls, path: str, missing_ok: bool = False) -> PasswordFile:
        """The file at ``path`` (empty when it does not exist and ``missing_ok``)."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if missing_ok:
                return cls()
            raise PasswordFileError(
                f"cannot read password file {path}: it does not exist"
            ) from None
        except OSError as e:
            raise PasswordFileError(f"cannot read password file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise PasswordFileError(f"password file {path} is not UTF-8") from None
        return cls.parse(text, path)

    def entries(self) -> Iterator[Entry]:
        return (line for line in self.lines if isinstance(line, Entry))

    def hashes(self) -> dict[str, str]:
        """identity -> hash."""
        return {entry.identity: entry.hash for entry in self.entries()}

    def identities(self) -> list[str]:
        return [entry.identity for entry in self.entries()]

    def with_user(self, identity: str, hashed: str) -> tuple[PasswordFile, bool]:
        """This file with ``identity``'s hash set (its line kept in place, or a new line at
        the end), and whether the identity is new."""
        check_identity(identity)
        entry = Entry(identity, hashed)
        lines = list(self.lines)
        for index, line in enumerate(lines):
            if isinstance(line, Entry) and line.identity == identity:
                lines[index] = entry
                return PasswordFile(tuple(lines)), False
        return PasswordFile((*lines, entry)), True

    def without_user(self, identity: str) -> tuple[PasswordFile, bool]:
        """This file without ``identity``'s line, and whether it was there."""
        lines = tuple(
            line
            for line in self.lines
            if not (isinstance(line, Entry) and line.identity == identity)
        )
        return PasswordFile(lines), len(lines) != len(self.lines)

    def text(self) -> str:
        return "".join(
            f"{line.identity}:{line.hash}\n" if isinstance(line, Entry) else f"{line}\n"
            for line in self.lines
        )


def write_atomically(path: str, text: str) -> None:
    """Replace the file at ``path`` with ``text`` (UTF-8) atomically: a temporary file in
    the same directory, written and synced, with the old file's mode (``0600`` for a new
    file) and, where allowed, its owner, renamed over ``path``; then the directory synced,
    so the rename itself survives a crash. OSError when it cannot be done (``path``
    unchanged, the temporary file removed)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    fd, temporary = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) if old else NEW_FILE_MODE)
            if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                # not ours to give away: then the file is the writer's
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def hash_password(password: bytes) -> str:
    """The argon2id hash of ``password`` (with a fresh salt), as the file keeps it."""
    return HASHER.hash(password)


def verify(hashed: str, password: bytes) -> bool:
    """Whether ``password`` is the one ``hashed`` was made from (constant time within
    argon2; False for a hash that cannot be read)."""
    try:
        return HASHER.verify(hashed, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False
