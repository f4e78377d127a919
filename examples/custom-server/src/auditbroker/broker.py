"""A Broker subclass: its ``msgbroker_*`` methods are hook implementations (subclass hooks,
no decorator), and it overrides one documented method.

- Topics under ``admin/`` are for the identity ``root`` only (publish and subscribe), in
  every protocol: ``msgbroker_authorize``.
- Every session's end is counted by reason: ``msgbroker_session_closed``; the counts are
  added to the status line SIGUSR1 logs (``status`` overridden).
"""

from __future__ import annotations

from collections import Counter

from msgbroker import Broker, Session


class AuditBroker(Broker):
    def __init__(self, *args: object, **kwargs: object) -> None:
        #: close reason -> sessions that ended for it
        self.closes: Counter[str] = Counter()
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def msgbroker_authorize(self, session: Session, action: str, topic: str | None) -> bool | None:
        if topic is not None and topic.startswith("admin/") and action in ("publish", "subscribe"):
            return session.identity == "root"
        return None  # abstain: other plugins (or the default, allow) decide

    def msgbroker_session_closed(self, session: Session, reason: str) -> None:
        self.closes[str(reason)] += 1

    def status(self) -> str:
        ends = ", ".join(f"{reason} {count}" for reason, count in sorted(self.closes.items()))
        return f"{super().status()}; sessions ended: {ends or 'none'}"
