"""A publisher's memory of where its messages go: routing key -> recipients, while the hub's
recipients stay the same.

Routing a message through the hub costs a :class:`~msgbroker.message.Message`, a topic
lookup, the pattern match and a fan-out per encoder. A connection that publishes on the
same few keys again and again (sbus's hot path) can skip all of it when nothing about
those keys needs the hub: it routes the first message of a key through the hub as usual,
then asks its :class:`RouteCache` to :meth:`~RouteCache.remember` the key, and hands every
next frame to :meth:`~RouteCache.send`, which writes it to the remembered recipients
directly and counts it as the hub would — or a whole read slice to
:meth:`~RouteCache.send_frames`, which does the same for every frame on a remembered key
without a call per frame, and gives the others back to the protocol.

A key is remembered only when the frame that came in is what every recipient gets: all of
them pattern subscribers (:meth:`Hub.subscribe_pattern`) of the sender's own encoder, no
exact subscriber of the topic (of any protocol: filters, queue groups and presence are the
hub's business), and no ``message_routed`` observer. Every remembered key is forgotten
as soon as :attr:`Hub.generation` moves: every subscription, pattern or close bumps it,
and so does the broker when its hooks change (a plugin added to a running broker may
observe or authorize). Authorization is the broker's and not the hub's: a protocol does
not remember keys while some plugin authorizes each request (``broker.authorizes`` and not
``broker.authorizes_per_topic``); a hook that decides per topic has answered for a key it
allowed until the generation changes (adding or removing a plugin changes it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from .hub import Hub, Peer
from .message import Encoder

#: what one remembered key holds: (hub generation, the recipients' ``send``, how many)
Route = tuple[int, tuple[Callable[[bytes], None], ...], int]


class RouteCache:
    """One sender's remembered routes (see the module docstring).

    ``encode`` is the encoder whose recipients get the sender's frames as they are (its
    own protocol's); ``echo``: the sender receives its own messages when it subscribes
    (sbus), else it is left out as :meth:`Hub.multicast` leaves it out. At most ``limit``
    keys are remembered; past it they are all forgotten and remembered again as they come.
    """

    __slots__ = ("_echo", "encode", "hub", "limit", "routes", "sender")

    def __init__(
        self, hub: Hub, sender: Peer, encode: Encoder, echo: bool = False, limit: int = 1024
    ) -> None:
        self.hub = hub
        self.sender = sender
        self.encode = encode
        self._echo = echo
        self.limit = limit
        #: routing key -> :data:`Route`
        self.routes: dict[Hashable, Route] = {}

    @property
    def echo(self) -> bool:
        return self._echo

    @echo.setter
    def echo(self, on: bool) -> None:
        """Whether the sender receives its own messages; changing it forgets every route."""
        if on != self._echo:
            self._echo = on
            self.routes.clear()

    def send(self, key: Hashable, frame: bytes) -> bool:
        """Route ``frame`` to the recipients remembered for ``key``, counted as the hub
        counts a multicast (the hub's ``source`` is the sender meanwhile, as in
        :meth:`Hub.multicast`). False when nothing valid is remembered for ``key``: route
        it through the hub, then :meth:`remember`."""
        route = self.routes.get(key)
        if route is None:
            return False
        hub = self.hub
        if route[0] != hub.generation:
            return False
        hub.source = self.sender
        for send in route[1]:
            send(frame)
        stats = hub.stats
        stats.routed += 1
        stats.delivered += route[2]
        return True

    def send_frames(
        self,
        frames: Iterable[bytes],
        prefix: bytes,
        separator: bytes,
        limit: int,
        other: Callable[[bytes], bool],
    ) -> None:
        """:meth:`send` for a slice of frames that carry their routing key as ``prefix``,
        the key, ``separator``, and are at most ``limit`` bytes (sbus: ``MSG key\\0...``):
        a frame on a remembered key goes to its recipients here, every other frame, in
        order, to ``other(frame)``, which returns False to end the slice (its connection
        closed). For a hot path: no call per remembered frame, counted once per slice."""
        hub, sender, get = self.hub, self.sender, self.routes.get
        start = len(prefix)
        routed = delivered = 0
        try:
            for frame in frames:
                if frame[:start] == prefix and len(frame) <= limit:
                    end = frame.find(separator, start)
                    route = get(frame[start:end]) if end >= start else None
                    if route is not None and route[0] == hub.generation:
                        hub.source = sender
                        for send in route[1]:
                            send(frame)
                        routed += 1
                        delivered += route[2]
                        continue
                if not other(frame):
                    return
        finally:
            stats = hub.stats
            stats.routed += routed
            stats.delivered += delivered

    def remember(self, key: Hashable, topic: str) -> bool:
        """Remember who receives an MCAST on ``topic`` under ``key``, if every recipient
        gets the sender's frame as it is (see the module docstring); True when it did.
        Call it after routing a message on ``topic`` through the hub."""
        hub = self.hub
        if hub.observer is not None or topic in hub.topics:
            return False
        if hub.cluster is not None and hub.cluster.interested(topic):
            return False  # it crosses to other nodes too
        groups = hub.pattern_recipients(topic) if hub.patterns else {}
        encode = self.encode
        if any(encoder is not encode for encoder in groups):
            return False
        sender, echo = self.sender, self._echo
        sends = tuple(peer.send for peer in groups.get(encode, ()) if echo or peer is not sender)
        routes = self.routes
        if len(routes) >= self.limit:
            routes.clear()
        routes[key] = (hub.generation, sends, len(sends))
        return True

    def forget(self) -> None:
        """Forget every remembered key."""
        self.routes.clear()
