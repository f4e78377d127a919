"""``twistd auditbroker``: msgbroker's options, and a service built on :class:`AuditBroker`."""

from __future__ import annotations

from typing import Any

from msgbroker import tap
from msgbroker.service import BrokerService

from .broker import AuditBroker


def options() -> type[tap.BrokerOptions]:
    """The same options as ``twistd msgbroker`` (the installed plugins' included)."""
    return tap.twistd_options()


def makeService(options: tap.BrokerOptions, reactor: Any = None) -> BrokerService:
    return tap.makeService(options, reactor, broker_class=AuditBroker)
