"""Micromessage2 codec, sans-IO: bytes in, frozen events out; values in, bytes out. No
Twisted here. This module is the one to import; the code lives in the modules it names.

- :mod:`.handshake` — the three-step handshake (``major u8, minor u8, flags u8, idlen u8,
  id, reqlen u16, req, optlen u16, opt``, big-endian, no frame-flags byte), extension lists,
  version negotiation and the active extensions.
- :mod:`.frames` — frames after the handshake. A flags byte: 0x01 COMMAND, 0x02
  EXTENSION, 0x04 ERROR, 0x08 LARGE (a u32 length, else u8), 0x10 CONTINUED; none of 0x07
  set is a MESSAGE; ERROR wins when several type bits are set. LARGE is written exactly
  when a payload exceeds 255 bytes and read for any length. Layouts::

      MESSAGE    flags, seq u16, destlen u8, dest, proplen u16, props, len, payload
      EXTENSION  flags, ext-id u8 (1..255), len, payload
      COMMAND    flags, len, "name;key=urlenc(v),key=urlenc(v)"
      ERROR      flags, len, utf-8 text (its sender closes the connection)

- :mod:`.fragments` — payloads over 1 MiB as several MESSAGE frames (CONTINUED).
- :mod:`.acks` — sequence numbers (1..65535, then 1 again) and cumulative acks.
- :mod:`.properties` — URL encoding, typed properties (``key:N42;``, ``D``, ``T``), commands.
- :mod:`.pubsub` — the ``subscribe`` and ``unsubscribe`` commands and their filters.

What the peer got wrong raises :class:`~msgbroker.errors.RemoteProtocolError`; a value
that cannot be written raises :class:`ValueError` (:class:`TypeError` for a property value
of a type Micromessage2 has not: a bool, a float).
"""

from __future__ import annotations

# the pubsub extension reads filters into the hub's own type
from msgbroker.filters import Filter, Op

from .acks import SEQ_CYCLE, ack_frame, acked_count, is_acked, next_seq, parse_ack, seq_distance
from .fragments import DEFAULT_MAX_MESSAGE, Reassembler, encode_message, split_message
from .frames import (
    COMMAND,
    CONTINUED,
    DEFAULT_MAX_PAYLOAD,
    ERROR,
    EXTENSION,
    FRAGMENT_SIZE,
    LARGE,
    ErrorFrame,
    ExtensionFrame,
    Frame,
    FrameDecoder,
    MessageBatch,
    MessageFrame,
    encode_frame,
    frame_type,
)
from .handshake import (
    DEFAULT_BATCH_ACK_COUNT,
    MAJOR,
    MINOR,
    ActiveExtensions,
    Extension,
    Handshake,
    HandshakeDecoder,
    UnsupportedExtensions,
    active_extensions,
    batch_ack_max_count,
    check_confirm,
    check_required,
    encode_extension_list,
    encode_handshake,
    negotiate_minor,
    parse_extension_list,
    unsupported_required,
)
from .properties import (
    Command,
    Properties,
    PropertyValue,
    datetime_to_epoch,
    encode_command,
    encode_properties,
    encode_value,
    epoch_to_datetime,
    parse_command,
    parse_properties,
    parse_value,
    urldecode,
    urlencode,
)
from .pubsub import (
    PubSubCommand,
    Subscribe,
    Unsubscribe,
    encode_filter,
    encode_pubsub,
    parse_filter,
    parse_pubsub,
)

__all__ = [
    "COMMAND",
    "CONTINUED",
    "DEFAULT_BATCH_ACK_COUNT",
    "DEFAULT_MAX_MESSAGE",
    "DEFAULT_MAX_PAYLOAD",
    "ERROR",
    "EXTENSION",
    "FRAGMENT_SIZE",
    "LARGE",
    "MAJOR",
    "MINOR",
    "SEQ_CYCLE",
    "ActiveExtensions",
    "Command",
    "ErrorFrame",
    "Extension",
    "ExtensionFrame",
    "Filter",
    "Frame",
    "FrameDecoder",
    "Handshake",
    "HandshakeDecoder",
    "MessageBatch",
    "MessageFrame",
    "Op",
    "Properties",
    "PropertyValue",
    "PubSubCommand",
    "Reassembler",
    "Subscribe",
    "Unsubscribe",
    "UnsupportedExtensions",
    "ack_frame",
    "acked_count",
    "active_extensions",
    "batch_ack_max_count",
    "check_confirm",
    "check_required",
    "datetime_to_epoch",
    "encode_command",
    "encode_extension_list",
    "encode_filter",
    "encode_frame",
    "encode_handshake",
    "encode_message",
    "encode_properties",
    "encode_pubsub",
    "encode_value",
    "epoch_to_datetime",
    "frame_type",
    "is_acked",
    "negotiate_minor",
    "next_seq",
    "parse_ack",
    "parse_command",
    "parse_extension_list",
    "parse_filter",
    "parse_properties",
    "parse_pubsub",
    "parse_value",
    "seq_distance",
    "split_message",
    "unsupported_required",
    "urldecode",
    "urlencode",
]
