"""What the broker and the hub know of one connection, whatever its protocol.

A :class:`Session` is made by :meth:`msgbroker.Broker.open_session` when a connection opens.
The hub routes to it (``send``, which is its output's ``send``, bound once: see
:mod:`msgbroker.output`), the protocol's server session answers through ``output.reply``,
and closing goes through :meth:`Session.close`, which the connection adapter (the
session's :class:`Link`) carries out on the transport.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from attrs import define, field

from .message import Encoder
from .reasons import CloseReason

if TYPE_CHECKING:
    from .hub import HubStats, Topic
    from .output import Output


class Link(Protocol):
    """What a session needs of its connection (the adapter in :mod:`msgbroker.connection`
    provides it; tests may give a fake)."""

    def close_transport(self, reason: CloseReason) -> None:
        """Close the transport for ``reason``: flushed, or aborted (a slow consumer)."""

    def abort(self) -> None:
        """Cut the connection at once (shutdown's last resort)."""

    def pause_reading(self) -> None:
        """Stop reading from the peer (its bytes wait in the kernel's buffers)."""

    def resume_reading(self) -> None:
        """Read from the peer again."""


@define(eq=False)
class Session:
    """One connection, whatever its protocol."""

    protocol: str
    encode: Encoder
    stats: HubStats
    link: Link
    host: str = ""
    tls_names: frozenset[str] | None = None
    identity: str | None = None
    #: hub-managed: topic name -> Topic
    subscriptions: dict[str, Topic] = field(factory=dict)
    #: how this session's output is written, chosen when it opened (:meth:`attach`)
    output: Output = field(default=None)
    #: the hub calls this per delivery: ``output.send``, bound once
    send: Callable[[bytes], None] = field(default=None)
    #: for queue groups (msgbroker.queues): whether the peer has room for another queue
    #: message, how many it has room for (None: no bound), and how it takes one (True:
    #: kept until acknowledged); an output with acknowledgements provides them
    ready: Callable[[], bool] | None = None
    room: Callable[[], int | None] | None = None
    deliver_queued: Callable[[bytes, Any, Any], bool] | None = None
    #: deliveries this session's policy dropped
    dropped: int = 0
    #: the broker's number for this session (1, 2, ... in the order they opened)
    id: int = 0
    #: when it opened, on the broker's clock (``reactor.seconds()``: the epoch for a real
    #: reactor)
    opened_at: float = 0.0
    #: traffic, counted once per received input and per written batch, never per message:
    #: bytes read (stream and WebSocket transports; sbus packets are not counted), messages
    #: this peer published (MCAST, UCAST, BCAST; a run counts each), bytes written (sbus:
    #: not counted), and frames delivered (one per delivery, but a pipelined run to one
    #: topic reaches each recipient as one frame; the hub counts every message delivered)
    bytes_in: int = 0
    messages_in: int = 0
    bytes_out: int = 0
    frames_out: int = 0
    close_reason: CloseReason | None = None
    #: what the peer got wrong, which limit: free text after the reason
    close_detail: str = ""
    #: True while the broker has stopped reading from this peer (:meth:`hold_reading`);
    #: keepalive timers count it as activity
    reading_held: bool = False
    #: told of deliveries this session's policy dropped (the broker logs them)
    on_dropped: Callable[[Session, int], None] | None = None
    # what each idle connection must not pay for is made when first needed: an empty set
    # is 216 bytes, an empty dict 64, an empty list 56
    _reading_holders: set[Any] | None = field(default=None, init=False, repr=False)
    _data: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _on_lost: list[Callable[[], None]] | None = field(default=None, init=False, repr=False)

    @property
    def data(self) -> dict[str, Any]:
        """Per-session state for plugins, keyed by plugin name."""
        data = self._data
        if data is None:
            data = self._data = {}
        return data

    @property
    def on_lost(self) -> list[Callable[[], None]]:
        """Called once the connection is gone (the service waits on these at shutdown)."""
        on_lost = self._on_lost
        if on_lost is None:
            on_lost = self._on_lost = []
        return on_lost

    @on_lost.setter
    def on_lost(self, callbacks: list[Callable[[], None]]) -> None:
        self._on_lost = callbacks

    def attach(self, output: Output) -> None:
        """Use ``output`` for everything this session writes (once, when it opens)."""
        self.output = output
        self.send = output.send
        self.ready = getattr(output, "ready", None)
        self.room = getattr(output, "room", None)
        self.deliver_queued = getattr(output, "deliver_queued", None)

    @property
    def close_text(self) -> str | None:
        """The reason and its detail, as logs and the journal show it."""
        reason = self.close_reason
        if reason is None:
            return None
        return f"{reason}: {self.close_detail}" if self.close_detail else str(reason)

    # -- holding the input ------------------------------------------------------------------

    def hold_reading(self, holder: Any) -> None:
        """Stop reading from this peer until ``holder`` (and every other holder) releases
        it: flood control pausing a publisher, a protocol holding requests back while a
        login is answered. Counted, so one holder's release never resumes what another
        still holds; the peer's further bytes wait in its socket buffers, not in ours."""
        holders = self._reading_holders
        if holders is None:
            holders = self._reading_holders = set()
        if not holders:
            self.reading_held = True
            if self.close_reason is None:
                self.link.pause_reading()
        holders.add(holder)

    def release_reading(self, holder: Any) -> None:
        """``holder`` no longer needs this peer held; reading resumes when nobody does."""
        holders = self._reading_holders
        if holders is None or holder not in holders:
            return
        holders.discard(holder)
        if not holders:
            self.reading_held = False
            if self.close_reason is None:
                self.link.resume_reading()

    # -- closing -----------------------------------------------------------------------------

    def close(self, reason: CloseReason, detail: str = "") -> None:
        """Close the connection for ``reason`` (the first reason wins)."""
        if self.close_reason is None:
            self.close_reason = reason
            self.close_detail = detail
            if reason is CloseReason.SLOW_CONSUMER:
                # its backlog is let go at once: it leaves the output budget
                self.output.stop()
            self.link.close_transport(reason)

    def kick(self, reason: str) -> None:
        """The hub closes this session: its identity logged in elsewhere."""
        self.output.stop()
        self.close(CloseReason.KICKED)

    def __repr__(self) -> str:
        return f"<Session {self.protocol} {self.identity or '-'} {self.host}>"
