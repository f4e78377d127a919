"""Pipelined publishes, the fast path: a client that writes many publish requests at once
(a :class:`~.codec.RequestRun` of action ``0.0.1.4``) has them routed as
:class:`~msgbroker.message.MessageRun` objects, one per stretch to one topic, and answered
with one write; STMP subscribers get their deliveries from a template filled in per
payload. The outcome is byte for byte what the general path (one :class:`~.codec.Request`
at a time through the router) gives; the tests compare the two.

Anything the fast path does not know how to take (an authorization hook that asks about
each request, a plugin that routes ``0.0.1.4`` itself, a request the general path would
refuse, a publish to a topic the authorization hook refuses) goes through the general path,
in order. An authorization hook that decides per topic (:func:`msgbroker.per_topic`) is
asked once per stretch to one topic.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from functools import partial
from itertools import chain, groupby, islice, repeat
from operator import add, eq, itemgetter
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]
from attrs import frozen

from msgbroker.message import Kind, Message, MessageRun

from . import actions, payloads
from .codec import Encoding, RequestRun

if TYPE_CHECKING:
    from .protocol import STMPServerSession

#: text a JSON string carries as it is: printable ASCII but for '"' and '\'
_PLAIN = rb"[\x20\x21\x23-\x5b\x5d-\x7e]"
#: a publish payload ``{"topic":T,"data":D}`` of such text, compact or with JSON whitespace
#: (Python's json.dumps writes ``{"topic": "t", "data": "x"}``)
_CANONICAL_PUBLISH = re.compile(
    rb'\s*\{\s*"topic"\s*:\s*"(%b+)"\s*,\s*"data"\s*:\s*"(%b*)"\s*\}\s*'.replace(
        rb"\s", rb"[ \t\n\r]"
    )
    % (_PLAIN, _PLAIN)
)
_PLAIN_DATA = re.compile(_PLAIN + rb"*")
#: a binary publish request, JSON, with PS (the payload follows)
_PUBLISH_HEAD = rb"\x50..\x00\x00\x01\x04...."
#: a whole run of such requests to one topic, every payload compact: {"topic":T,"data":D}
_CANONICAL_RUN = re.compile(
    _PUBLISH_HEAD + rb'\{"topic":"(' + _PLAIN + rb'+)","data":"' + _PLAIN + rb'*"\}'
    rb"(?:" + _PUBLISH_HEAD + rb'\{"topic":"\1","data":"' + _PLAIN + rb'*"\})*',
    re.DOTALL,
)
#: each request of a run of canonical publishes to any topics (a client rotating over
#: topics): (id, body, topic, data), a body being the payload after "{"; 11 bytes of head
#: and the "{" come before it
_FIELDS = re.compile(
    rb"\x50(..)\x00\x00\x01\x04....\{"
    rb'("topic":"(' + _PLAIN + rb'+)","data":"(' + _PLAIN + rb'*)"\})',
    re.DOTALL,
)
_TOPIC_OPEN = b'{"topic":"'
#: cuts such a run into ``[b"", id, body, id, body...]``, a body being a payload after "{"
_CUT = re.compile(rb"\x50(..)\x00\x00\x01\x04....\{", re.DOTALL)
#: the data of each request of such a run
_DATA = re.compile(rb'"data":"(' + _PLAIN + rb'*)"\}')
_U32 = struct.Struct(">I")
#: an Ok response without payload is ``0xC0 ID 0x00``
_OK_HEAD, _OK_TAIL = b"\xc0", b"\x00"
_OK_JOIN = _OK_TAIL + _OK_HEAD
#: a binary notify of action 0.0.1.16 with a PS (JSON: encoding 2; msgpack: encoding 3)
_DELIVERY_HEAD = {
    Encoding.JSON: b"\x90" + _U32.pack(payloads.DELIVERY),
    Encoding.MSGPACK: b"\x98" + _U32.pack(payloads.DELIVERY),
}
_HEAD = 11  # a request's fixed part with PS


@frozen
class CanonicalPublishes:
    """A run's ``wire``: the bodies of publish requests whose payloads are all
    ``{"topic":T,"data":D}`` with T and D as they are in JSON (see :func:`_whole`); a body is
    the payload without its ``{``, so a delivery is ``{"from":S,"kind":"mcast",`` + body."""

    bodies: list[bytes]


def takes(connection: STMPServerSession, run: RequestRun) -> bool:
    """Whether the fast path may handle ``run`` for ``connection`` (the server session;
    else: request by request). The checks the general path makes per request hold for the
    whole run."""
    return (
        run.action == payloads.PUBLISH
        and run.encoding in payloads.STRUCTURED
        and connection.peer.identity is not None
        and (not connection.broker.authorizes or connection.broker.authorizes_per_topic)
        and _routed_to_builtin(connection.router.lookup(payloads.PUBLISH))
    )


def _routed_to_builtin(route: Any) -> bool:
    return route is not None and route.handler is actions.publish


def publish_run(connection: STMPServerSession, run: RequestRun) -> None:
    """Route ``run`` (publish requests) as the general path would, request by request in
    effect: consecutive publishes to one topic go out as one :class:`MessageRun` and one
    write of Ok responses; a request the fast path cannot read is flushed behind them and
    handed to the general path (which answers it as it should: 0x20 BadRequest...)."""
    session, broker, block = connection.peer, connection.broker, run.block
    hub = broker.hub
    identity = session.identity
    assert identity is not None  # takes() checked it
    if run.encoding == Encoding.JSON and _whole(connection, run, identity):
        return
    json = run.encoding == Encoding.JSON
    topic: str | None = None
    datas: list[bytes] = []
    ids: list[bytes] = []

    def flush() -> bool:
        """Route what is pending; False once the connection is closed."""
        if ids:
            assert topic is not None  # set with the first id
            route = list(datas)
            routed = MessageRun(Kind.MCAST, identity, "stmp", topic, len(route), lambda: route)
            hub.multicast_run(session, routed)
            connection.reply(_OK_HEAD + _OK_JOIN.join(ids) + _OK_TAIL)
            datas.clear()
            ids.clear()
        return not connection.closed

    for start, end in run.spans():
        match = _CANONICAL_PUBLISH.fullmatch(block, start + _HEAD, end) if json else None
        if match is not None:
            this, data = match.group(1).decode("ascii"), match.group(2)
        else:
            parsed = _parse(block[start + _HEAD : end], run.encoding)
            if parsed is None:  # the general path knows what to answer
                if not flush():
                    return
                connection.received(run.request(start, end))
                if connection.closed:
                    return
                continue
            this, data = parsed
        if this != topic:
            if not flush():
                return
            if broker.authorizes and not broker.authorize(session, "publish", this):
                topic = None  # refused: the general path answers it (0x23)
                connection.received(run.request(start, end))
                if connection.closed:
                    return
                continue
            topic = this
        datas.append(data)
        ids.append(block[start + 1 : start + 3])
    flush()


def _whole(connection: STMPServerSession, run: RequestRun, identity: str) -> bool:
    """Route ``run`` in a few C calls when every request is a canonical JSON publish to one
    topic (the common case: a client pipelining publishes), or with no more than a
    :class:`Message` per request when they go to several topics (:func:`_mixed`); False
    (nothing done) when not every request is canonical.

    Why the checks suffice: the regex tiles the block into request heads and canonical
    payloads. A payload cannot contain a head (a head holds NUL bytes; the payload text
    none), and no misaligned head fits (the action bytes ``00 00 01 04`` pin it), so every
    real request start is a tile start; as many tiles as requests means they are the same.
    """
    block = run.block
    match = _CANONICAL_RUN.fullmatch(block)
    if match is None:
        return _mixed(connection, run, identity)
    if block.count(_TOPIC_OPEN) != run.count:
        return False
    topic = match.group(1).decode("ascii")
    broker = connection.broker
    if broker.authorizes and not broker.authorize(connection.peer, "publish", topic):
        return False  # request by request: each is refused
    cut = _CUT.split(block)
    routed = MessageRun(
        Kind.MCAST,
        identity,
        "stmp",
        topic,
        run.count,
        partial(_DATA.findall, block),
        CanonicalPublishes(cut[2::2]),
    )
    connection.broker.hub.multicast_run(connection.peer, routed)
    connection.reply(_OK_HEAD + _OK_JOIN.join(cut[1::2]) + _OK_TAIL)
    return True


def _mixed(connection: STMPServerSession, run: RequestRun, identity: str) -> bool:
    """:func:`_whole` for canonical publishes to several topics: one regex pass reads every
    request's id, topic and data; each stretch to one topic is routed as a
    :class:`MessageRun` (a lone request as a :class:`Message`, cheaper for the hub), and
    every Ok goes in one write. False (nothing done) when a request is not canonical or the
    authorization hook refuses one of the topics (the general loop answers each then)."""
    block = run.block
    fields = _FIELDS.findall(block)
    # the tiles found, as many as requests, cover the block without a gap: it is tiled
    # (as _CANONICAL_RUN would check), for a single pass over it
    if len(fields) != run.count or sum(map(len, map(_BODY, fields))) + 12 * run.count != len(
        block
    ):
        return False
    names = _topic_names
    if len(names) > 1024:
        names.clear()
    raws = list(map(_TOPIC, fields))
    topics = set(raws)
    for raw in topics:
        if raw not in names:
            names[raw] = raw.decode("ascii")
    broker, session = connection.broker, connection.peer
    if broker.authorizes and not all(
        broker.authorize(session, "publish", names[raw]) for raw in topics
    ):
        return False
    hub = broker.hub
    multicast, mcast = hub.multicast, Kind.MCAST
    if not any(map(eq, raws, islice(raws, 1, None))):
        # no two consecutive requests to one topic (a client rotating over topics): one
        # Message each, without grouping
        for _id, _body, raw, data in fields:
            multicast(session, Message(mcast, identity, "stmp", names[raw], data))
        connection.reply(_OK_HEAD + _OK_JOIN.join(map(_ID, fields)) + _OK_TAIL)
        return True
    for raw, group in groupby(fields, _TOPIC):
        stretch = list(group)
        if len(stretch) == 1:
            multicast(session, Message(mcast, identity, "stmp", names[raw], stretch[0][3]))
            continue
        datas = [field[3] for field in stretch]
        bodies = CanonicalPublishes([field[1] for field in stretch])
        routed = MessageRun(mcast, identity, "stmp", names[raw], len(datas), datas.copy, bodies)
        hub.multicast_run(session, routed)
    connection.reply(_OK_HEAD + _OK_JOIN.join(map(_ID, fields)) + _OK_TAIL)
    return True


#: topics as read from canonical publishes (their bytes: the text, ASCII), so that a client
#: rotating over topics has each decoded once; bounded by clearing it past 1,024 topics
_topic_names: dict[bytes, str] = {}
_ID, _BODY, _TOPIC = itemgetter(0), itemgetter(1), itemgetter(2)


def _parse(payload: bytes, encoding: int) -> tuple[str, bytes] | None:
    """(topic, data) of a publish payload the general path would accept, else None."""
    try:
        fields = payloads.decode_payload(payload, encoding)
        topic = fields["topic"] if type(fields) is dict else None
        if not isinstance(topic, str) or not topic:
            return None
        return topic, payloads.data_from(fields, encoding)
    except (ValueError, KeyError):
        return None


# -- deliveries of a run to STMP subscribers (binary framing) ------------------------------


def run_encoder(
    framing: str, encoding: int, encode: Callable[[Message], bytes | None]
) -> Callable[[MessageRun], tuple[bytes, int]] | None:
    """The run encoding (see :class:`MessageRun`) of the delivery encoder ``encode`` for
    ``framing`` and ``encoding``, or None where there is none (WebSocket framings: a frame
    header per message)."""
    if framing != "binary" or encoding not in _DELIVERY_HEAD:
        return None
    fill = _json_fill if encoding == Encoding.JSON else _msgpack_fill

    def encode_run(run: MessageRun) -> tuple[bytes, int]:
        if run.kind is not Kind.MCAST:
            return _one_by_one(run, encode)
        try:
            return fill(run, encode)
        except ValueError:  # a sender or topic the encoding cannot carry: each is skipped
            return _one_by_one(run, encode)

    return encode_run


def templated(
    framing: str, encoding: int, general: Callable[[Message], bytes | None]
) -> Callable[[Message], bytes | None]:
    """The delivery encoder ``general`` of ``framing`` and ``encoding``; for binary JSON, one
    that fills an MCAST's delivery in when its data needs no escaping, and leaves the rest
    to ``general`` (one function, called once per message fanned out: no second call for
    the common case).

    The delivery is ``{"from":S,"kind":"mcast","topic":T,"data":"`` + data + ``"}``: the
    sender's part and the topic's part are kept apart (the last 1,024 of each), so that
    many senders to many topics (100 x 100) do not outgrow a cache of their pairs."""
    if framing != "binary" or encoding != Encoding.JSON:
        return general
    head, pack, plain = _DELIVERY_HEAD[Encoding.JSON], _U32.pack, _PLAIN_DATA.fullmatch
    mcast = Kind.MCAST
    senders: dict[str, bytes] = {}
    topics: dict[str, bytes] = {}

    def encode(message: Message) -> bytes | None:
        data = message.payload
        if message.kind is not mcast or message.topic is None or not plain(data):
            return general(message)
        sender = senders.get(message.sender)
        topic = topics.get(message.topic)
        if sender is None or topic is None:
            try:
                sender = _part(senders, message.sender, b'{"from":', b',"kind":"mcast","topic":')
                topic = _part(topics, message.topic, b"", b',"data":"')
            except ValueError:  # a sender or topic JSON cannot carry: this one is skipped
                return None
        size = len(sender) + len(topic) + len(data) + 2
        return b"".join((head, pack(size), sender, topic, data, b'"}'))

    return encode


def _part(parts: dict[str, bytes], text: str, before: bytes, after: bytes) -> bytes:
    """``text`` as JSON between ``before`` and ``after``, kept in ``parts`` (at most 1,024);
    ValueError when JSON cannot carry it as UTF-8 (a lone surrogate)."""
    part = parts.get(text)
    if part is None:
        if len(parts) >= 1024:
            parts.clear()
        part = parts[text] = before + payloads.encode_payload(text, Encoding.JSON) + after
    return part


def _one_by_one(run: MessageRun, encode: Callable[[Message], bytes | None]) -> tuple[bytes, int]:
    frames = [m.encoded(encode) for m in run.messages()]
    carried = [f for f in frames if f is not None]
    return b"".join(carried), len(carried)


def _json_fill(run: MessageRun, encode: Callable[[Message], bytes | None]) -> tuple[bytes, int]:
    """``{"from":S,"kind":"mcast","topic":T,"data":"`` + data + ``"}`` when JSON carries all
    the data as it is; message by message otherwise (escapes, non-ASCII, base64)."""
    wire = run.wire
    if type(wire) is CanonicalPublishes:
        return _json_from_bodies(run.sender, wire.bodies), run.count
    fields = payloads.delivery_fields(run.sender, "mcast", run.topic, b"", Encoding.JSON)
    template = payloads.encode_payload(fields, Encoding.JSON)
    prefix = template[: -len(b'"}')]
    datas = run.payloads()
    head, size = _DELIVERY_HEAD[Encoding.JSON], len(template)
    if _PLAIN_DATA.fullmatch(b"".join(datas)):  # all of them: C iterators do the rest
        sizes = map(_U32.pack, map(add, repeat(size), map(len, datas)))
        parts = zip(repeat(head), sizes, repeat(prefix), datas, repeat(b'"}'))
        return b"".join(chain.from_iterable(parts)), run.count
    return _one_by_one(run, encode)  # the encoder itself templates the plain ones


def _json_from_bodies(sender: str, bodies: list[bytes]) -> bytes:
    """Deliveries of canonical publishes: notify head, PS, ``{"from":S,"kind":"mcast",``,
    body; interleaved by C iterators, nothing per message in Python."""
    prefix = b'{"from":' + payloads.encode_payload(sender, Encoding.JSON) + b',"kind":"mcast",'
    sizes = map(_U32.pack, map(add, repeat(len(prefix)), map(len, bodies)))
    parts = zip(repeat(_DELIVERY_HEAD[Encoding.JSON]), sizes, repeat(prefix), bodies)
    return b"".join(chain.from_iterable(parts))


def _msgpack_fill(run: MessageRun, encode: Callable[[Message], bytes | None]) -> tuple[bytes, int]:
    """The msgpack map ``{"from","kind","topic","data"}`` with ``"data"`` packed per payload
    (msgpack writes the keys in insertion order, so the prefix is fixed)."""
    fields = payloads.delivery_fields(run.sender, "mcast", run.topic, b"", Encoding.MSGPACK)
    template = payloads.encode_payload(fields, Encoding.MSGPACK)
    empty = msgpack.packb(b"", use_bin_type=True)
    prefix = template[: -len(empty)]
    packed = list(map(msgpack.Packer(use_bin_type=True).pack, run.payloads()))
    sizes = map(_U32.pack, map(add, repeat(len(prefix)), map(len, packed)))
    parts = zip(repeat(_DELIVERY_HEAD[Encoding.MSGPACK]), sizes, repeat(prefix), packed)
    return b"".join(chain.from_iterable(parts)), run.count
