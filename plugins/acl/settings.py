"""The ACL's configuration section, ``[acl]``, and its command-line option.

::

    [acl]
    file = "/etc/msgbroker/acl"     # --acl FILE; no file: everything is allowed

The option's flag is also a top-level key (``acl = "/etc/msgbroker/acl"``).
"""

from __future__ import annotations

from attrs import frozen

from msgbroker import BrokerConfig, ConfigSection, Option


@frozen
class AclSettings:
    """The ACL file (``None``: no access control, and nothing is asked per request)."""

    file: str | None = None


SECTION = ConfigSection(
    "acl",
    AclSettings,
    options=(
        Option(
            "file",
            "str",
            "Allow only what this ACL file says (docs/operations.md, Access control).",
            flag="acl",
        ),
    ),
    help="access control: who may publish, subscribe, unicast and broadcast (docs/operations.md)",
)


def acl_settings(config: BrokerConfig) -> AclSettings:
    """The ``[acl]`` settings of a broker's (resolved) configuration."""
    return config.section(SECTION.name, AclSettings)
