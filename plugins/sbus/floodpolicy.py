"""sbus flood control: what a client chose (:class:`FloodPolicy`, set by its control
messages) and the pause of a publisher that some client's outbox asked to wait
(:class:`Throttle`). The outbox that applies them is :mod:`.flood` (see its docstring for
what each choice does), which re-exports these."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attrs import define

if TYPE_CHECKING:
    from .flood import Outbox

#: the choices of each group of control messages (``blocking/soft/...`` and so on)
SOFT = ("queue", "discard", "block", "error")
HARD = ("discard", "block", "error")
ORDER = ("queue", "stack", "random")


@define
class FloodPolicy:
    """One client's current choices (the most recent control message of each group)."""

    soft: str = "queue"
    hard: str = "error"
    order: str = "queue"

    def apply(self, key: bytes) -> bool:
        """Take the control message ``key`` (``blocking/soft/queue`` ...); False when it is
        not a flood-control key."""
        group, _, how = key.decode("ascii", "replace").rpartition("/")
        if group == "blocking/soft" and how in SOFT:
            self.soft = how
        elif group == "blocking/hard" and how in HARD:
            self.hard = how
        elif group == "order" and how in ORDER:
            self.order = how
        else:
            return False
        return True


class Throttle:
    """Pauses a publisher's reading while some outbox it filled asks it to wait, and
    resumes it when none does any longer. ``pause``/``resume`` are its transport's
    ``pauseProducing``/``resumeProducing``."""

    __slots__ = ("_holders", "pause", "resume")

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self.pause = pause
        self.resume = resume
        self._holders: set[Outbox] = set()

    @property
    def held(self) -> bool:
        return bool(self._holders)

    def hold(self, outbox: Outbox) -> None:
        if not self._holders:
            self.pause()
        self._holders.add(outbox)

    def release(self, outbox: Outbox) -> None:
        holders = self._holders
        if outbox in holders:
            holders.discard(outbox)
            if not holders:
                self.resume()
