"""The users plugin's settings: ``users`` in the ``[auth]`` table of the configuration
(``--users FILE`` on the command line, or a top-level ``users = "FILE"``).

::

    [auth]
    schemes = ["password", "cert"]    # the broker's --auth, written in the table
    users = "/etc/msgbroker/users"    # --users: the password file

``[auth]`` is the table form of the broker's ``auth`` option (``auth = ["secret"]`` at the
top level still works): its ``schemes`` key is ``--auth``, its other keys this section's.
"""

from __future__ import annotations

from attrs import frozen

from msgbroker import BrokerConfig, ConfigSection, Option


@frozen
class UsersSettings:
    """The password file (``None``: no users, the ``password`` scheme refuses everyone)."""

    users: str | None = None


SECTION = ConfigSection(
    "auth",
    UsersSettings,
    options=(
        Option(
            "users",
            "str",
            "Password file (identity:argon2id lines) of the password scheme.",
            flag="users",
        ),
    ),
    help="users of the password scheme (docs/operations.md, Users)",
)


def users_settings(config: BrokerConfig) -> UsersSettings:
    """The ``[auth]`` settings of a broker's (resolved) configuration."""
    return config.section(SECTION.name, UsersSettings)
