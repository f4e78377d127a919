"""The journal's on-disk format: directory layout and the two Parquet schemas.

This is the contract with the readers (the Spark analytics and streaming jobs): change it
only compatibly (add nullable columns at the end). Layout under the journal directory::

    messages/date=YYYY-MM-DD/seg-NODE-00000042.parquet
    sessions/date=YYYY-MM-DD/seg-NODE-00000007.parquet

``date`` (UTC, from ``ts``) is a Hive-style partition: it is in the directory name, not in
the files, so Spark's partition discovery and ``pyarrow.dataset(..., partitioning="hive")``
add it as a column. ``NODE`` is the writing broker's node name as file names spell it
(``:`` as ``~``: ``seg-db1~4444-00000042.parquet``), so several nodes can write into one
directory; a writer without a node name (and every writer before node names) writes
``seg-00000042.parquet``. Sequence numbers count up per table and node across dates and
restarts. Files whose names start with ``.`` (temporaries being written) are not part of
the journal; Spark and pyarrow datasets skip them.

Every row says which node wrote it (``node``); a message another node published, which
this node delivered to its own subscribers, says where it was published (``origin_node``),
so a report over all nodes counts each message once. Segments from before these columns
have neither: read as null (no node recorded; the report counts it as node ``""``).

A name that is not valid UTF-8 (a lone surrogate, as an sbus key with an undecodable byte
gives) is stored escaped in its string column, and the row's ``escaped`` column lists the
columns that were (:mod:`.names` has the escape and its inverse).
"""

from __future__ import annotations

import re

import pyarrow as pa

MESSAGES = "messages"
SESSIONS = "sessions"
TABLES = (MESSAGES, SESSIONS)

#: a finalized segment's file name, and the temporary it is written under first
SEGMENT_NAME = "seg-{node}{seq:08d}.parquet"
TEMP_NAME = ".seg-{node}{seq:08d}.parquet.tmp"
#: a segment's name: the node's file form (none before node names) and the sequence number
SEGMENT_RE = re.compile(r"seg-(?:(.+)-)?(\d{8,})\.parquet")
TEMP_RE = re.compile(r"\.seg-(?:(.+)-)?(\d{8,})\.parquet\.tmp")
PARTITION_PREFIX = "date="

#: ``sessions.event`` values
OPEN, LOGIN, AUTH_FAILURE, CLOSE = "open", "login", "auth_failure", "close"
SESSION_EVENTS = (OPEN, LOGIN, AUTH_FAILURE, CLOSE)

TIMESTAMP = pa.timestamp("us", tz="UTC")
RECIPIENTS = pa.map_(pa.string(), pa.int32())
#: ``escaped``: the names of a row's string columns whose value is stored escaped
ESCAPED = pa.list_(pa.string())
ESCAPED_DOC = (
    "the string columns of this row stored escaped, because their value was not valid "
    "Unicode text (a lone surrogate); null when none (docs/journal.md, names.py)"
)


NODE_DOC = (
    "the node that wrote the row (the broker's --node-name); null in segments written "
    "before node names"
)


def _field(name: str, type_: pa.DataType, doc: str, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


MESSAGES_SCHEMA = pa.schema(
    [
        _field("ts", TIMESTAMP, "when the broker routed the message (UTC)"),
        _field("protocol", pa.string(), "the sender's protocol: ssmp, stmp, mm2, sbus..."),
        _field("sender", pa.string(), "the sender's identity ('.' when anonymous)"),
        _field("kind", pa.string(), "mcast, ucast, bcast, subscribe or unsubscribe"),
        _field(
            "topic",
            pa.string(),
            "the topic (mcast, presence) or the target identity (ucast); null for bcast",
            nullable=True,
        ),
        _field(
            "count",
            pa.int32(),
            "messages this row stands for: 1, or a pipelined run routed at once (one "
            "sender, one topic, the same recipients each); they share every other column",
        ),
        _field("payload_size", pa.int64(), "payload bytes, all of the row's messages together"),
        _field("recipients", RECIPIENTS, "deliveries per recipient protocol, per message"),
        _field("delivered", pa.int32(), "deliveries per message (sum of recipients)"),
        _field("skipped", pa.int32(), "recipients per message whose protocol could not carry it"),
        _field("dropped", pa.int32(), "deliveries a slow-consumer policy discarded, in all"),
        _field(
            "payload",
            pa.binary(),
            "the payload bytes; null unless the broker runs with --journal-payloads",
            nullable=True,
        ),
        _field("escaped", ESCAPED, ESCAPED_DOC, nullable=True),
        _field("node", pa.string(), NODE_DOC, nullable=True),
        _field(
            "origin_node",
            pa.string(),
            "the node the message was published on, when another node published it and "
            "this one routed it to its own subscribers (a cluster); null: published here",
            nullable=True,
        ),
    ],
    metadata={"msgbroker.journal": "messages/4"},
)

SESSIONS_SCHEMA = pa.schema(
    [
        _field("ts", TIMESTAMP, "when the event happened (UTC)"),
        _field("event", pa.string(), "open, login, auth_failure or close"),
        _field("protocol", pa.string(), "the connection's protocol"),
        _field(
            "session_id",
            pa.int64(),
            "the connection, unique across broker restarts (see docs/journal.md)",
            nullable=True,
        ),
        _field(
            "identity",
            pa.string(),
            "login: the identity granted; auth_failure: the one asked for; close: the "
            "session's identity (null if it never logged in); open: null",
            nullable=True,
        ),
        _field("host", pa.string(), "the peer's address ('' for a local socket)"),
        _field("scheme", pa.string(), "the auth scheme tried (login, auth_failure)", nullable=True),
        _field(
            "reason",
            pa.string(),
            "close: why the connection ended; auth_failure: why the login was refused",
            nullable=True,
        ),
        _field("escaped", ESCAPED, ESCAPED_DOC, nullable=True),
        _field("node", pa.string(), NODE_DOC, nullable=True),
    ],
    metadata={"msgbroker.journal": "sessions/3"},
)

SCHEMAS = {MESSAGES: MESSAGES_SCHEMA, SESSIONS: SESSIONS_SCHEMA}


def segment_name(node_file: str, seq: int, temporary: bool = False) -> str:
    """A segment's file name (or its temporary's) for the node spelled ``node_file`` (its
    file form, :func:`msgbroker.nodes.file_form`; ``""``: no node)."""
    node = f"{node_file}-" if node_file else ""
    return (TEMP_NAME if temporary else SEGMENT_NAME).format(node=node, seq=seq)
