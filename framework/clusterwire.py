"""What crosses between nodes, as bytes (sans-IO: no Twisted, no I/O).

Every publication an engine carries is ``HEADER BODY``, both msgpack: the header
``[1, node, epoch]`` says who sent it (a node skips its own publications by comparing the
leading bytes, without decoding), the body ``[op, items]``:

- ``"m"``: messages, each ``[kind, sender, protocol, topic, payload, properties, encoding,
  presence]``, or a pipelined run ``["r", sender, protocol, topic, [payloads]]``, or a
  broadcast ``["b", sender, protocol, payload, [topics]]`` (it reaches the receiving node's
  members of those topics);
- ``"c"``: changes of the sender's state, ``[[field, value or None], ...]``;
- ``"j"`` (joined: read my state), ``"h"`` (heartbeat), ``"b"`` (bye: I am leaving).

A node's state is fields: ``["m", topic, identity]`` -> ``[protocol, presence]`` (a member
of an exact topic), ``["p", pattern]`` -> ``b""`` (an sbus pattern), ``["i", identity]`` ->
``b""`` (an identity held), ``["q", topic, group]`` -> how many of the topic's members are
in that queue group (they are members too). Fields of other kinds are kept and ignored (a
later version's).

A queue group's entries (:mod:`msgbroker.clusterqueues`) are one message each, as in
``"m"`` publications: :func:`entry` and :func:`read_entry`.
Property values that are :class:`~decimal.Decimal` travel as extension type 1 (their text).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import msgpack  # type: ignore[import-untyped]

from .message import Kind, Message, MessageRun, RemoteMessage

VERSION = 1
#: extension type of a Decimal property value (its text)
_DECIMAL = 1

MESSAGES, CHANGES, JOIN, HEARTBEAT, BYE = "m", "c", "j", "h", "b"
MEMBER, PATTERN, IDENTITY, QUEUE = "m", "p", "i", "q"
_RUN, _BCAST = "r", "b"
_KINDS = {kind.value: kind for kind in Kind}


class WireError(ValueError):
    """Bytes that are no publication of this version (malformed or foreign)."""


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return msgpack.ExtType(_DECIMAL, str(value).encode("ascii"))
    raise TypeError(f"cannot send a {type(value).__name__} across nodes")


def _ext(code: int, data: bytes) -> Any:
    if code == _DECIMAL:
        return Decimal(data.decode("ascii"))
    raise WireError(f"unknown extension type {code}")


#: topics may hold lone surrogates (sbus keys that are not UTF-8, decoded with
#: surrogateescape): they cross as such, not as an error
_TEXT_ERRORS = "surrogatepass"
_packer = msgpack.Packer(default=_default, use_bin_type=True, unicode_errors=_TEXT_ERRORS)


def pack(value: Any) -> bytes:
    packed: bytes = _packer.pack(value)
    return packed


def header(node: str, epoch: str) -> bytes:
    return pack([VERSION, node, epoch])


def body(op: str, items: Any = None) -> bytes:
    return pack([op, items])


#: what every ``"m"`` body starts with: a 2-array, then the op
_MESSAGES_HEAD = b"\x92" + pack(MESSAGES)


def packed_items(items: list[Any]) -> bytes:
    """``items`` packed one after the other, without the array's header: a part of a
    :func:`messages_body` (packed in one call, then the header cut off)."""
    packed = pack(items)
    count = len(items)
    return packed[1 if count < 16 else 3 if count < 65_536 else 5 :]


def messages_body(parts: list[bytes], count: int) -> bytes:
    """The body of a ``"m"`` publication whose ``count`` items are ``parts`` joined (each
    from :func:`packed_items`): items going to several nodes are packed once."""
    header: bytes = _packer.pack_array_header(count)
    return _MESSAGES_HEAD + header + b"".join(parts)


def decode(data: bytes) -> tuple[str, str, str, Any]:
    """``(node, epoch, op, items)``; :class:`WireError` for anything else."""
    unpacker = msgpack.Unpacker(
        raw=False,
        unicode_errors=_TEXT_ERRORS,
        ext_hook=_ext,
        strict_map_key=False,
        max_buffer_size=len(data) + 1,
    )
    try:
        unpacker.feed(data)
        head = unpacker.unpack()
        op_items = unpacker.unpack()
    except WireError:
        raise
    except Exception as e:  # msgpack raises several kinds for bad input
        raise WireError(f"not msgpack: {type(e).__name__}") from None
    if (
        not isinstance(head, list)
        or len(head) != 3
        or head[0] != VERSION
        or not isinstance(head[1], str)
        or not isinstance(head[2], str)
        or not isinstance(op_items, list)
        or len(op_items) != 2
        or not isinstance(op_items[0], str)
    ):
        raise WireError("not a publication of this version")
    return head[1], head[2], op_items[0], op_items[1]


# -- messages ------------------------------------------------------------------------------


def message_item(message: Message) -> list[Any]:
    props = dict(message.properties) if message.properties else None
    return [
        message.kind.value,
        message.sender,
        message.protocol,
        message.topic,
        message.payload,
        props,
        message.encoding,
        message.presence,
    ]


def entry(message: Message, origin: str) -> bytes:
    """One message published on the node ``origin`` as a queue group's entry."""
    return pack([origin, message_item(message)])


def run_entries(run: MessageRun, origin: str) -> list[bytes]:
    """Each message of a run as an entry (a queue group gives each to one member)."""
    head = [Kind.MCAST.value, run.sender, run.protocol, run.topic]
    return [pack([origin, [*head, payload, None, None, False]]) for payload in run.payloads()]


def read_entry(data: bytes) -> Message:
    """The MCAST an entry holds; :class:`WireError` for anything else."""
    try:
        item = msgpack.unpackb(data, raw=False, ext_hook=_ext, strict_map_key=False)
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"not msgpack: {type(e).__name__}") from None
    try:
        origin, inner = item
    except (TypeError, ValueError):
        raise WireError("not an entry") from None
    _check(str, origin)
    message = read_item(inner, origin)
    if not isinstance(message, Message) or message.kind is not Kind.MCAST:
        raise WireError("not an MCAST")
    return message


def run_item(run: MessageRun) -> list[Any]:
    return [_RUN, run.sender, run.protocol, run.topic, list(run.payloads())]


def broadcast_item(message: Message, topics: Iterable[str]) -> list[Any]:
    return [_BCAST, message.sender, message.protocol, message.payload, list(topics)]


def read_item(item: Any, origin: str) -> Message | MessageRun | tuple[Message, list[str]]:
    """A message, a run, or a broadcast and the topics it reaches, published on the node
    ``origin`` (the journal records it: :class:`~msgbroker.message.RemoteMessage`);
    :class:`WireError` for an item that is none of them."""
    try:
        tag = item[0]
        if tag == _RUN:
            _, sender, protocol, topic, payloads = item
            _check(str, sender, protocol, topic)
            if not isinstance(payloads, list):
                _bad("bad run")
            _check(bytes, *payloads)
            return MessageRun(
                Kind.MCAST, sender, protocol, topic, len(payloads), lambda: payloads,
                origin_node=origin,
            )  # fmt: skip
        if tag == _BCAST:
            _, sender, protocol, payload, topics = item
            _check(str, sender, protocol, *topics)
            _check(bytes, payload)
            message = RemoteMessage(Kind.BCAST, sender, protocol, None, payload, origin_node=origin)
            return message, list(topics)
        kind_text, sender, protocol, topic, payload, props, encoding, presence = item
        kind = _KINDS[kind_text]
        _check(str, sender, protocol)
        _check(bytes, payload)
        if not (topic is None or isinstance(topic, str)) or not (
            props is None or isinstance(props, dict)
        ):
            _bad("bad message")
        if not (encoding is None or isinstance(encoding, str)) or not isinstance(presence, bool):
            _bad("bad message")
        return RemoteMessage(
            kind, sender, protocol, topic, payload, props, encoding, presence, origin_node=origin
        )
    except WireError:
        raise
    except (TypeError, ValueError, KeyError, IndexError):
        raise WireError("bad message item") from None


def _check(kind: type, *values: Any) -> None:
    for value in values:
        if not isinstance(value, kind):
            _bad(f"expected {kind.__name__}")


def _bad(why: str) -> None:
    raise WireError(why)


# -- state fields --------------------------------------------------------------------------


def member_field(topic: str, identity: str) -> bytes:
    return pack([MEMBER, topic, identity])


def member_value(protocol: str, presence: bool) -> bytes:
    return pack([protocol, presence])


def pattern_field(pattern: str) -> bytes:
    return pack([PATTERN, pattern])


def identity_field(identity: str) -> bytes:
    return pack([IDENTITY, identity])


def read_field(field: bytes) -> tuple[str, ...] | None:
    """``("m", topic, identity)``, ``("p", pattern)``, ``("i", identity)``, ``("q", topic,
    group)``, or ``None`` for a field of another kind (kept, ignored)."""
    try:
        value = msgpack.unpackb(field, raw=False, unicode_errors=_TEXT_ERRORS)
    except Exception:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    if (value[0] in (MEMBER, QUEUE) and len(value) == 3) or (
        value[0] in (PATTERN, IDENTITY) and len(value) == 2
    ):
        return tuple(value)
    return None


def queue_field(topic: str, group: str) -> bytes:
    return pack([QUEUE, topic, group])


def read_queue_value(value: bytes) -> int:
    """A queue field's member count (0 for a value that is none)."""
    try:
        count = msgpack.unpackb(value, raw=False)
    except Exception:
        return 0
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def read_member_value(value: bytes) -> tuple[str, bool]:
    try:
        protocol, presence = msgpack.unpackb(value, raw=False, unicode_errors=_TEXT_ERRORS)
    except Exception:
        return "?", False
    return (protocol if isinstance(protocol, str) else "?"), bool(presence)


def read_changes(items: Any) -> Sequence[tuple[bytes, bytes | None]]:
    if not isinstance(items, list):
        raise WireError("bad changes")
    changes = []
    for change in items:
        if (
            not isinstance(change, list)
            or len(change) != 2
            or not isinstance(change[0], bytes)
            or not (change[1] is None or isinstance(change[1], bytes))
        ):
            raise WireError("bad change")
        changes.append((change[0], change[1]))
    return changes
