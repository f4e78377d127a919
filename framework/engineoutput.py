"""What an engine's connection to its server writes (public: a third party's engine uses
it as the Redis and NATS engines do).

Output is queued and written once per :meth:`EngineOutput.flush` (one write per received
chunk, whatever was published in it). When the server stops reading, the transport pauses
its producer (the connection, which calls :meth:`~EngineOutput.pause`): what is flushed
meanwhile is held here, and what would make the queued and held bytes pass
``max_buffer`` is refused (:meth:`~EngineOutput.fits` says so before it is queued), so
that a slow engine never grows the node's memory nor stalls local delivery; the engine
counts what was refused. ``force`` lets the node's own state through regardless (it is
small, and a node whose state is lost is wrong everywhere). On resume what was held is
written in one go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from attrs import define, field

__all__ = ["EngineOutput"]


@define
class EngineOutput:
    """Bounded, coalesced output of one engine connection; ``write`` is the transport's
    (or the TLS layer's) write, set when the connection is made."""

    max_buffer: int
    write: Callable[[bytes], object] | None = None
    paused: bool = False
    out_bytes: int = 0
    held_bytes: int = 0
    _out: list[bytes] = field(factory=list)
    _held: list[bytes] = field(factory=list)

    @property
    def buffered(self) -> int:
        """Bytes queued or held."""
        return self.out_bytes + self.held_bytes

    def fits(self, size: int, force: bool = False) -> bool:
        """Whether ``size`` more bytes may be queued now (always while the server reads,
        or with ``force``)."""
        return force or not self.paused or self.buffered + size <= self.max_buffer

    def queue(self, data: bytes) -> None:
        self._out.append(data)
        self.out_bytes += len(data)

    def queue_all(self, parts: Iterable[bytes]) -> None:
        for data in parts:
            self.queue(data)

    def flush(self) -> None:
        """Write what was queued in one write (held instead while paused)."""
        if not self._out or self.write is None:
            return
        data = b"".join(self._out)
        self._out, self.out_bytes = [], 0
        if self.paused:
            self._held.append(data)
            self.held_bytes += len(data)
        else:
            self.write(data)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """The server reads again: what was held goes, in one write."""
        self.paused = False
        held, self._held, self.held_bytes = self._held, [], 0
        if held and self.write is not None:
            self.write(b"".join(held))

    def clear(self) -> None:
        """The connection is gone: nothing queued or held will be written."""
        self._out, self.out_bytes, self._held, self.held_bytes = [], 0, [], 0
