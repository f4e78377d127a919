"""``msgbroker users``: the password file of ``--users``, like ``mosquitto_passwd``.

::

    msgbroker users add FILE IDENTITY      # the password from stdin, or asked twice on a tty
    msgbroker users remove FILE IDENTITY
    msgbroker users list FILE

``add`` creates the file (mode 0600) when it does not exist, and changes the password of an
identity already there. Every change rewrites the file atomically
(:func:`.passwords.write_atomically`); a running broker reads it again on SIGHUP.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import TYPE_CHECKING, TextIO

from msgbroker.cli import CommandError

if TYPE_CHECKING:
    from .passwords import PasswordFile

# the hashing (argon2) is imported when a users command runs, not whenever `msgbroker`
# builds its list of commands

NAME = "users"
HELP = "add, remove and list the users of a password file (--users)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Edit the password file the broker's --users option reads (identity:argon2id "
        "lines). A running broker reads it again on SIGHUP."
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser(
        "add",
        help="add a user, or change a user's password",
        description="Add IDENTITY to FILE (created, mode 0600, if missing), or change its "
        "password. The password is read from standard input (its first line) when that is "
        "not a terminal, and asked for twice when it is.",
    )
    add.add_argument("file", metavar="FILE")
    add.add_argument("identity", metavar="IDENTITY")
    add.set_defaults(action_run=_add)
    remove = actions.add_parser("remove", help="remove a user")
    remove.add_argument("file", metavar="FILE")
    remove.add_argument("identity", metavar="IDENTITY")
    remove.set_defaults(action_run=_remove)
    listing = actions.add_parser("list", help="list the users, one identity a line")
    listing.add_argument("file", metavar="FILE")
    listing.set_defaults(action_run=_list)


def run(args: argparse.Namespace) -> int:
    status: int = args.action_run(args)
    return status


def read_password(stdin: TextIO, prompt: bool) -> bytes:
    """The new password: asked twice (without echo) when ``prompt``, else the first line
    of ``stdin`` (its line break removed). Empty, or two that differ, is refused."""
    if prompt:
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Password again: "):
            raise CommandError("the passwords do not match: nothing changed")
    else:
        password = stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise CommandError("the password is empty: nothing changed")
    return password.encode("utf-8")


def _read(path: str, missing_ok: bool = False) -> PasswordFile:
    from msgbroker.errors import ConfigError

    from .passwords import PasswordFile

    try:
        return PasswordFile.read(path, missing_ok=missing_ok)
    except ConfigError as e:
        raise CommandError(str(e)) from None


def _write(path: str, users: PasswordFile) -> None:
    from .passwords import write_atomically

    try:
        write_atomically(path, users.text())
    except OSError as e:
        raise CommandError(f"cannot write {path}: {e.strerror}") from None


def _add(args: argparse.Namespace) -> int:
    from .passwords import check_identity, hash_password

    try:
        identity = check_identity(args.identity)
    except ValueError as e:
        raise CommandError(str(e)) from None
    users = _read(args.file, missing_ok=True)
    password = read_password(sys.stdin, prompt=sys.stdin.isatty())
    users, new = users.with_user(identity, hash_password(password))
    _write(args.file, users)
    what = "added" if new else "changed the password of"
    sys.stderr.write(f"{what} {identity} in {args.file}\n")
    return 0


def _remove(args: argparse.Namespace) -> int:
    users, found = _read(args.file).without_user(args.identity)
    if not found:
        raise CommandError(f"{args.identity!r} is not in {args.file}: nothing changed")
    _write(args.file, users)
    sys.stderr.write(f"removed {args.identity} from {args.file}\n")
    return 0


def _list(args: argparse.Namespace) -> int:
    for identity in _read(args.file).identities():
        sys.stdout.write(f"{identity}\n")
    return 0
