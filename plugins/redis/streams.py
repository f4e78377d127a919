"""The Redis engine's queue store (:class:`msgbroker.engine.QueueStore`): Micromessage2
queue groups across nodes on Redis Streams.

- ``PREFIX:q:LEN:GROUP:TOPIC`` is a group's stream (``LEN``: the group name's length, so
  any names are told apart), with one consumer group named like the queue group; each
  node reads as the consumer named like the node. Entries are one field, ``m``: the
  message (:func:`msgbroker.clusterwire.entry`).
- ``PREFIX:qw:LEN:GROUP:TOPIC`` is the group's wake-up channel: a publishing node
  publishes an empty message there after the entries it added (one per write), and the
  nodes with members, subscribed, read.
- ``PREFIX:qm:LEN:GROUP:TOPIC`` is the set of nodes with members in a group that is not
  durable: a node adds itself when it opens the group, and removes itself when its last
  member leaves, with a Lua script that deletes the stream when the set is empty — in one
  step, so a node opening the group meanwhile either keeps it or makes a new one, never
  loses it to a deletion decided on an older view. A node that dies stays in the set: its
  stream goes by expiry (nodes that are not taken for dead by a late heartbeat never
  delete what a live node holds).
- ``PREFIX:durable`` is the set of durable groups any node opened, as ``LEN:GROUP:TOPIC``
  (read at connect: nodes publish to them without members). Removing a durable group is
  the operator's: ``SREM`` it there and ``DEL`` its stream.

Publishing is ``XADD ... NOMKSTREAM MAXLEN ~ queue-max-length``: only a node with members
makes a stream (``XGROUP CREATE ... MKSTREAM``), so a message for a group deleted
meanwhile goes nowhere rather than making an orphan stream. Reading is ``XREADGROUP ...
>``, acknowledging ``XACK``, renewing ``XCLAIM ... JUSTID`` to this node (its idle time
starts again), taking over ``XAUTOCLAIM`` with ``queue-redeliver-after`` as the minimum
idle time. Nodes with members keep a stream every few seconds: a Lua script trims the
entries older than the oldest one pending (all acknowledged), and a stream that is not
durable gets an expiry that its nodes keep pushing back (so it goes when they all die).
Everything goes over the engine's one connection (RESP3 allows commands beside
subscriptions), pipelined with the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.defer import Deferred

from msgbroker.engine import QueueEntry, QueueKey

from .connection import RedisError

if TYPE_CHECKING:
    from .engine import RedisEngine

#: a node leaves a group that is not durable: the stream goes with the last node
_LEAVE = b"""
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('SCARD', KEYS[2]) == 0 then
  return redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
"""

#: drop a stream's entries older than the oldest pending one (acknowledged, all of them);
#: scripts see RESP2 replies (flat lists)
_TRIM = b"""
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then return 0 end
for _, g in ipairs(groups) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == ARGV[1] then
    local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
    local floor = info['last-delivered-id']
    if pending[1] > 0 then floor = pending[2] end
    return redis.call('XTRIM', KEYS[1], 'MINID', '~', floor)
  end
end
return 0
"""


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class RedisStreams:
    """The queue store on the Redis engine's connection (see the module docstring)."""

    def __init__(self, engine: RedisEngine) -> None:
        self.engine = engine
        context = engine.context
        settings = context.settings
        prefix = _b(settings.prefix)
        self._stream_prefix = prefix + b":q:"
        self.wake_prefix = prefix + b":qw:"
        self._members_prefix = prefix + b":qm:"
        self.durables_key = prefix + b":durable"
        self.consumer = _b(context.node)
        self.redeliver_ms = max(1, round(settings.queue_redeliver_after * 1000))
        self.max_length = settings.queue_max_length
        #: a stream that is not durable outlives the last node keeping it (every quarter
        #: of queue-redeliver-after) this long
        self.ttl_ms = max(1000, 4 * self.redeliver_ms)
        #: open groups: key -> (stream, wake channel, durable)
        self.opened: dict[QueueKey, tuple[bytes, bytes, bool]] = {}
        #: wake channel -> what to call
        self.wakes: dict[bytes, Callable[[], None]] = {}
        #: stream -> where XAUTOCLAIM goes on
        self._cursors: dict[bytes, bytes] = {}

    def _names(self, key: QueueKey) -> tuple[bytes, bytes]:
        suffix = _suffix(key)
        return self._stream_prefix + suffix, self.wake_prefix + suffix

    # -- the engine's side -----------------------------------------------------------------

    def connected(self) -> None:
        """The engine (re)connected and subscribed to :attr:`wakes`: make every open group
        again (Redis may have restarted empty)."""
        for key in self.opened:
            self._make(key)

    def woken(self, channel: bytes) -> None:
        wake = self.wakes.get(channel)
        if wake is not None:
            wake()

    def _make(self, key: QueueKey) -> None:
        conn = self.engine.conn
        if conn is None or not self.engine.ready:
            return
        stream, _channel, durable = self.opened[key]
        suffix = _suffix(key)
        if durable:
            self.engine._send([(b"SADD", self.durables_key, suffix)], True)
        else:  # a member node; until the first keep(), it goes even if every node dies
            members = self._members_prefix + suffix
            self.engine._send([(b"SADD", members, self.consumer)], True)
        d = conn.command(b"XGROUP", b"CREATE", stream, _b(key[1]), b"0", b"MKSTREAM")
        d.addErrback(self._ignore, b"BUSYGROUP")  # made already
        if not durable:
            self.engine._send(
                [(b"PEXPIRE", stream, self.ttl_ms), (b"PEXPIRE", members, self.ttl_ms)], True
            )

    def _ignore(self, failure: Any, expected: bytes) -> None:
        failure.trap(RedisError)
        text = failure.getErrorMessage()
        if not text.startswith(expected.decode()) and text not in _LOST:
            self.engine.context.log("queue", f"cluster queues: Redis answered an error: {text}")

    # -- QueueStore --------------------------------------------------------------------------

    def open(self, key: QueueKey, durable: bool, wake: Callable[[], None]) -> None:
        stream, channel = self._names(key)
        self.opened[key] = (stream, channel, durable)
        self.wakes[channel] = wake
        if self.engine.ready:
            self.engine._send([(b"SUBSCRIBE", channel)], force=True)
            self._make(key)

    def close(self, key: QueueKey) -> None:
        found = self.opened.pop(key, None)
        if found is None:
            return
        stream, channel, durable = found
        self.wakes.pop(channel, None)
        self._cursors.pop(stream, None)
        self.engine._send([(b"UNSUBSCRIBE", channel)], force=True)
        if not durable:
            members = self._members_prefix + _suffix(key)
            self.engine._send([(b"EVAL", _LEAVE, 2, stream, members, self.consumer)], True)

    def add(self, key: QueueKey, entries: Sequence[bytes], missing: Callable[[], None]) -> bool:
        stream, channel = self._names(key)
        head = (b"XADD", stream, b"NOMKSTREAM", b"MAXLEN", b"~", self.max_length, b"*", b"m")
        commands: list[Sequence[bytes | str | int]] = [(*head, entry) for entry in entries[:-1]]
        if not self.engine._send(commands):
            return False
        conn = self.engine.conn
        assert conn is not None  # _send said so
        # the last one's answer says whether the stream is there (nil: NOMKSTREAM)
        last = conn.command(*head, entries[-1])
        last.addCallbacks(lambda reply: missing() if reply is None else None, _quiet)
        self.engine._send([(b"PUBLISH", channel, b"")])
        return True

    def read(self, key: QueueKey, count: int) -> Deferred[list[QueueEntry]]:
        conn = self.engine.conn
        if conn is None or not self.engine.ready:
            return defer.fail(RedisError("not connected"))
        stream, _channel = self._names(key)
        d = conn.command(
            b"XREADGROUP", b"GROUP", _b(key[1]), self.consumer, b"COUNT", count,
            b"STREAMS", stream, b">",
        )  # fmt: skip
        d.addCallback(_read_reply)
        d.addErrback(self._no_group, key)
        return d

    def _no_group(self, failure: Any, key: QueueKey) -> list[QueueEntry]:
        """The group is gone (deleted by a node that saw no member left, or Redis restarted
        empty): made again, and nothing read this time."""
        failure.trap(RedisError)
        if not failure.getErrorMessage().startswith("NOGROUP"):
            return failure
        if key in self.opened:
            self._make(key)
            self.engine.flush()
        return []

    def claim(self, key: QueueKey, count: int) -> Deferred[list[QueueEntry]]:
        conn = self.engine.conn
        if conn is None or not self.engine.ready:
            return defer.fail(RedisError("not connected"))
        stream, _channel = self._names(key)
        cursor = self._cursors.get(stream, b"0-0")
        d = conn.command(
            b"XAUTOCLAIM", stream, _b(key[1]), self.consumer, self.redeliver_ms, cursor,
            b"COUNT", count,
        )  # fmt: skip

        def claimed(reply: Any) -> list[QueueEntry]:
            if key in self.opened and isinstance(reply, list) and reply:
                self._cursors[stream] = reply[0]
            return _entries(reply[1] if isinstance(reply, list) and len(reply) > 1 else None)

        d.addCallback(claimed)
        d.addErrback(self._no_group, key)
        return d

    def ack(self, key: QueueKey, ids: Sequence[bytes]) -> None:
        self._quietly(key, (b"XACK",), ids)

    def touch(self, key: QueueKey, ids: Sequence[bytes]) -> None:
        self._quietly(key, (b"XCLAIM",), ids, (b"JUSTID",))

    def _quietly(
        self, key: QueueKey, verb: tuple[bytes, ...], ids: Sequence[bytes],
        tail: tuple[bytes, ...] = (),
    ) -> None:  # fmt: skip
        """XACK or XCLAIM on ``ids``: a group deleted meanwhile (NOGROUP) is no trouble."""
        conn = self.engine.conn
        if conn is None or not self.engine.ready or not ids:
            return
        stream, _channel = self._names(key)
        group = _b(key[1])
        if verb == (b"XACK",):
            args: tuple[bytes | int, ...] = (b"XACK", stream, group, *ids)
        else:
            args = (b"XCLAIM", stream, group, self.consumer, 0, *ids, *tail)
        conn.command(*args).addErrback(self._ignore, b"NOGROUP")

    def keep(self, key: QueueKey, durable: bool) -> None:
        stream, _channel = self._names(key)
        commands: list[Sequence[bytes | str | int]] = [(b"EVAL", _TRIM, 1, stream, _b(key[1]))]
        if not durable:
            members = self._members_prefix + _suffix(key)
            commands += [(b"PEXPIRE", stream, self.ttl_ms), (b"PEXPIRE", members, self.ttl_ms)]
        self.engine._send(commands, force=True)

    def durables(self) -> Deferred[list[QueueKey]]:
        conn = self.engine.conn
        if conn is None or not self.engine.ready:
            return defer.fail(RedisError("not connected"))
        d = conn.command(b"SMEMBERS", self.durables_key)
        d.addCallback(_durable_keys)
        return d


#: what a lost connection's pending commands fail with (nothing to log: the cluster says so)
_LOST = frozenset({"connection lost", "not connected"})


def _quiet(failure: Any) -> None:
    """An add's answer lost with the connection: what crossed is counted elsewhere."""
    failure.trap(RedisError)


def _read_reply(reply: Any) -> list[QueueEntry]:
    """XREADGROUP's reply (RESP3: a map of stream -> entries; RESP2: a list of pairs)."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [pair[1] for pair in reply]
    found: list[QueueEntry] = []
    for entries in streams:
        found += _entries(entries)
    return found


def _entries(entries: Any) -> list[QueueEntry]:
    """``[[id, [field, value, ...]], ...]`` as (id, the ``m`` field); an entry deleted
    meanwhile (no fields) or without ``m`` is left out."""
    found: list[QueueEntry] = []
    for entry in entries or ():
        if not isinstance(entry, list) or len(entry) != 2:
            continue
        entry_id, fields = entry
        if isinstance(fields, list) and len(fields) >= 2 and fields[0] == b"m":
            found.append((entry_id, fields[1]))
    return found


def _suffix(key: QueueKey) -> bytes:
    """``LEN:GROUP:TOPIC``: a group's part of its key names (LEN tells the names apart)."""
    topic, group = key
    name = _b(group)
    return b"%d:%s:%s" % (len(name), name, _b(topic))


def _read_suffix(suffix: bytes) -> QueueKey | None:
    length, sep, rest = suffix.partition(b":")
    if not sep or not length.isdigit():
        return None
    size = int(length)
    group, colon, topic = rest[:size], rest[size : size + 1], rest[size + 1 :]
    if len(group) != size or colon != b":":
        return None
    return topic.decode("utf-8", "surrogateescape"), group.decode("utf-8", "surrogateescape")


def _durable_keys(members: Any) -> list[QueueKey]:
    """The durable groups' set, read; what is not a group's suffix is left out."""
    found = (_read_suffix(m) for m in members or () if isinstance(m, bytes))
    return [key for key in found if key is not None]
