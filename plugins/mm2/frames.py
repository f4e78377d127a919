"""Micromessage2 frames, sans-IO: :func:`encode_frame` and the incremental
:class:`FrameDecoder`. The wire format is described in :mod:`.codec`; import from there.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from attrs import field, frozen

from msgbroker.errors import RemoteProtocolError

from .properties import (
    Command,
    Properties,
    as_properties,
    ascii_text,
    encode_command,
    encode_properties,
    is_valid_name,
    parse_command,
    parse_properties,
)

COMMAND = 0x01
EXTENSION = 0x02
ERROR = 0x04
LARGE = 0x08
CONTINUED = 0x10
#: the bits a frame type is made of; none of them set is a MESSAGE
TYPE_BITS = COMMAND | EXTENSION | ERROR
#: 1 MiB: payloads over this travel as several MESSAGE frames (the spec, DECISIONS.md)
FRAGMENT_SIZE = 1 << 20
#: the largest payload one frame may carry unless configured: a fragment's size, since a
#: peer that follows the spec never sends more in one frame (the spec says "should", so
#: the decoder's limit can be raised)
DEFAULT_MAX_PAYLOAD = FRAGMENT_SIZE

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
#: a MESSAGE frame's flags, sequence number and destination length
_FRAME_HEAD = struct.Struct(">BHB")

# -- frames ---------------------------------------------------------------------------------


@frozen(slots=True)
class MessageFrame:
    """A MESSAGE frame. ``properties`` are (key, typed value) pairs in wire order (a mapping
    is accepted and turned into them); ``continued`` is the CONTINUED flag: more of this
    payload follows in the next MESSAGE frame (see :mod:`.fragments`)."""

    seq: int
    destination: str
    payload: bytes = b""
    properties: Properties = field(default=(), converter=as_properties)
    continued: bool = False


@frozen(slots=True)
class ExtensionFrame:
    """An EXTENSION frame: ``ext_id`` (1..255) is the extension's handshake index."""

    ext_id: int
    payload: bytes = b""


@frozen(slots=True)
class ErrorFrame:
    """An ERROR frame; its sender closes the connection afterwards."""

    text: str


Frame = MessageFrame | ExtensionFrame | Command | ErrorFrame


@frozen(slots=True)
class MessageBatch:
    """``len(payloads)`` (2 or more) consecutive MESSAGE frames, numbered ``first_seq``
    onwards without a gap, each whole in one frame and without properties: what a client
    pipelining publishes sends. All to ``destination``, or, when ``destinations`` is set
    (a *mixed* batch: a client rotating over topics), each to its own destination there
    (``destination`` is then the first one's). Only :meth:`FrameDecoder.feed_runs` makes
    them; :meth:`frames` gives the MESSAGE frames they stand for."""

    first_seq: int
    destination: str
    payloads: list[bytes]
    destinations: list[str] | None = None

    def frames(self) -> list[MessageFrame]:
        out, seq = [], self.first_seq
        destinations = self.destinations or [self.destination] * len(self.payloads)
        for destination, payload in zip(destinations, self.payloads, strict=True):
            out.append(MessageFrame(seq, destination, payload))
            seq = 1 if seq == 0xFFFF else seq + 1
        return out


def _length(size: int) -> tuple[int, bytes]:
    """(LARGE or 0, the length field): LARGE exactly when the payload exceeds 255 bytes."""
    if size <= 255:
        return 0, bytes((size,))
    if size > 0xFFFFFFFF:
        raise ValueError(f"payload of {size} bytes does not fit a frame")
    return LARGE, _U32.pack(size)


def encode_frame(frame: Frame) -> bytes:
    """One frame's bytes; ValueError for a frame the protocol cannot carry."""
    if isinstance(frame, MessageFrame):
        return _encode_message(frame)
    if isinstance(frame, ExtensionFrame):
        if not 1 <= frame.ext_id <= 255:
            raise ValueError(f"extension id out of 1..255: {frame.ext_id}")
        large, length = _length(len(frame.payload))
        return bytes((EXTENSION | large, frame.ext_id)) + length + frame.payload
    if isinstance(frame, Command):
        payload = encode_command(frame)
        large, length = _length(len(payload))
        return bytes((COMMAND | large,)) + length + payload
    if isinstance(frame, ErrorFrame):
        payload = frame.text.encode("utf-8")
        large, length = _length(len(payload))
        return bytes((ERROR | large,)) + length + payload
    raise TypeError(f"not a frame: {frame!r}")


def _encode_message(frame: MessageFrame) -> bytes:
    if not 1 <= frame.seq <= 0xFFFF:
        raise ValueError(f"sequence number out of 1..65535: {frame.seq}")
    if not is_valid_name(frame.destination):
        raise ValueError(f"destination is not 0..255 printable ASCII: {frame.destination!r}")
    props = encode_properties(frame.properties)
    if len(props) > 0xFFFF:
        raise ValueError(f"properties of {len(props)} bytes do not fit a frame (65535)")
    large, length = _length(len(frame.payload))
    flags = large | (CONTINUED if frame.continued else 0)
    dest = frame.destination.encode("ascii")
    return b"".join(
        (
            bytes((flags,)),
            _U16.pack(frame.seq),
            bytes((len(dest),)),
            dest,
            _U16.pack(len(props)),
            props,
            length,
            frame.payload,
        )
    )


# -- decoding -------------------------------------------------------------------------------


def frame_type(flags: int) -> int:
    """COMMAND, EXTENSION, ERROR or 0 (MESSAGE) for a flags byte; the peer's error when the
    byte is not a frame this version can read.

    - Bits above CONTINUED (0x20, 0x40, 0x80) are errors, not ignored: no version defines
      them, and a new flag may change the frame's layout (as LARGE does), so reading on
      would misparse every later frame.
    - ERROR wins over the other type bits (DECISIONS.md); COMMAND and EXTENSION together
      name no layout and are an error.
    - CONTINUED belongs to MESSAGE frames (only their payloads are split); on COMMAND and
      EXTENSION it is an error, on ERROR it is ignored so the peer's reason still reaches us.
    """
    if flags & ~(TYPE_BITS | LARGE | CONTINUED):
        raise RemoteProtocolError(f"unknown frame flags {flags:#04x}")
    if flags & ERROR:
        return ERROR
    kind = flags & TYPE_BITS
    if kind == COMMAND | EXTENSION:
        raise RemoteProtocolError(f"frame flags {flags:#04x} set both COMMAND and EXTENSION")
    if kind and flags & CONTINUED:
        raise RemoteProtocolError(f"CONTINUED on a frame that is not a MESSAGE ({flags:#04x})")
    return kind


def _parse(buf: bytearray, max_payload: int) -> tuple[Frame, int] | int:
    """The frame at the start of ``buf`` as (frame, its size), or the number of bytes needed
    before more of it can be read. Each field is checked as soon as its bytes are there, so
    how the bytes were chunked never changes whether (or where) an error is found."""
    size = len(buf)
    if not size:
        return 1
    flags = buf[0]
    kind = frame_type(flags)
    width = 4 if flags & LARGE else 1
    if kind == 0:
        return _parse_message(buf, flags, width, max_payload)
    start = 2 if kind == EXTENSION else 1
    # the id is checked as soon as its byte is in, so chunking never moves the error
    if kind == EXTENSION:
        if size < 2:
            return 2
        if buf[1] == 0:
            raise RemoteProtocolError("extension id 0 (ids start at 1)")
    if size < start + width:
        return start + width
    length = _read_length(buf, start, width, max_payload)
    end = start + width + length
    if size < end:
        return end
    payload = bytes(buf[start + width : end])
    if kind == EXTENSION:
        return ExtensionFrame(buf[1], payload), end
    if kind == COMMAND:
        return parse_command(payload), end
    # the text is only read by people: a bad byte must not cost us the peer's reason
    return ErrorFrame(payload.decode("utf-8", "replace")), end


def _read_length(buf: bytearray, pos: int, width: int, max_payload: int) -> int:
    length = _U32.unpack_from(buf, pos)[0] if width == 4 else buf[pos]
    if length > max_payload:
        raise RemoteProtocolError(f"frame payload of {length} bytes exceeds {max_payload}")
    return length


def _parse_message(
    buf: bytearray, flags: int, width: int, max_payload: int
) -> tuple[Frame, int] | int:
    size = len(buf)
    if size < 3:
        return 3
    seq = _U16.unpack_from(buf, 1)[0]
    if seq == 0:
        raise RemoteProtocolError("MESSAGE with sequence number 0 (they start at 1)")
    if size < 4:
        return 4
    props_at = 4 + buf[3]
    if size < props_at:
        return props_at
    destination = ascii_text(bytes(buf[4:props_at]), "destination")
    if not is_valid_name(destination):
        raise RemoteProtocolError(f"destination with control characters: {destination[:40]!r}")
    if size < props_at + 2:
        return props_at + 2
    length_at = props_at + 2 + _U16.unpack_from(buf, props_at)[0]
    if size < length_at:
        return length_at
    properties = parse_properties(bytes(buf[props_at + 2 : length_at]))
    if size < length_at + width:
        return length_at + width
    end = length_at + width + _read_length(buf, length_at, width, max_payload)
    if size < end:
        return end
    payload = bytes(buf[length_at + width : end])
    return MessageFrame(seq, destination, payload, properties, bool(flags & CONTINUED)), end


#: destinations (their bytes) already read and found valid, so a client rotating over
#: topics has each read once; module-level on purpose: pure text, the same for every broker,
#: bounded by clearing it past 1,024 names
_names: dict[bytes, str] = {}


def _name(raw: bytes) -> str | None:
    """``raw`` as a destination when the general parser would read it as one (kept in
    ``_names``); None when it would not (the general parser reports why)."""
    if not raw.isascii():
        return None
    name = raw.decode("ascii")
    if not is_valid_name(name):
        return None
    if len(_names) >= 1024:
        _names.clear()
    _names[raw] = name
    return name


#: how much of its buffer a batch reads at most (see FrameDecoder._batch)
_WINDOW = 256 << 10


def _two_simple_frames(buf: bytearray, size: int) -> bool:
    """Whether ``buf`` starts with two frames a batch may take (flags, numbers and no
    properties; their destinations and payloads are checked as the batch reads them), so
    that the copy a batch makes is not made for one frame followed by another kind."""
    at = 4 + buf[3]
    if at + 3 > size or buf[at] or buf[at + 1]:
        return False
    if buf[0]:  # LARGE
        if at + 6 > size:
            return False
        end = at + 6 + _U32.unpack_from(buf, at + 2)[0]
    else:
        end = at + 3 + buf[at + 2]
    if end + 4 > size or buf[end] & ~LARGE:
        return False
    seq = _U16.unpack_from(buf, 1)[0]
    if _U16.unpack_from(buf, end + 1)[0] != (1 if seq == 0xFFFF else seq + 1):
        return False
    at = end + 4 + buf[end + 3]
    return at + 2 <= size and not buf[at] and not buf[at + 1]


class FrameDecoder:
    """Incremental parser of a frame stream (everything after the handshake).

    ``feed(data)`` buffers ``data`` at once and returns an iterator of the frames now
    complete; :meth:`next_event` reads one. A frame the peer got wrong raises
    :class:`RemoteProtocolError` after every frame before it, and again on every later
    call: the stream cannot be resynchronised. ``max_payload`` bounds each frame's payload
    (a MESSAGE frame's destination and properties have their own u8/u16 bounds).
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._buf = bytearray()
        self._need = 1  # bytes _buf must hold before parsing can get further
        self._max = max_payload
        self._error: RemoteProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def next_event(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive."""
        if self._error is not None:
            raise self._error
        if len(self._buf) < self._need:
            return None
        try:
            result = _parse(self._buf, self._max)
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        if isinstance(result, int):
            self._need = result
            return None
        frame, end = result
        del self._buf[:end]  # cheap: a bytearray drops its front without moving the rest
        self._need = 1
        return frame

    def feed(self, data: bytes) -> Iterator[Frame]:
        """Buffer ``data``; iterate the result for the frames now complete."""
        self.receive_data(data)
        return iter(self.next_event, None)

    def feed_runs(self, data: bytes) -> Iterator[Frame | MessageBatch]:
        """:meth:`feed`, but consecutive simple MESSAGE frames (one destination, numbers
        without a gap, no properties, not fragments) come out as one :class:`MessageBatch`
        (as many as are complete). A server uses this."""
        self.receive_data(data)
        while True:
            batch = self._batch() if self._error is None else None
            if batch is not None:
                yield batch
                continue
            frame = self.next_event()
            if frame is None:
                return
            yield frame

    def _batch(self) -> MessageBatch | None:
        """The batch at the start of the buffer, taken off it; None (nothing taken) when
        fewer than two simple frames are there: the general parser handles those."""
        buf, limit = self._buf, self._max
        size = len(buf)
        if size < 7 or buf[0] & ~LARGE:
            return None
        first_seq = seq = _U16.unpack_from(buf, 1)[0]
        if first_seq == 0:
            return None  # the general parser reports it
        if not _two_simple_frames(buf, size):
            return None  # the general parser: no copy for one frame
        names, frame_head, u32 = _names, _FRAME_HEAD.unpack_from, _U32.unpack_from
        payloads: list[bytes] = []
        destinations: list[str] = []
        pos = 0
        raw, name = b"", ""
        raw_len = -1  # no destination read yet
        # Read from a bytes copy of the buffer: a slice of it is one object, where a slice
        # of the bytearray must be copied again into bytes. At most _WINDOW bytes (more
        # than a socket read) are copied; a batch longer than that ends there.
        data = bytes(buf) if size <= _WINDOW else bytes(buf[:_WINDOW])
        have = len(data)
        while pos + 4 <= have:
            # a simple frame: flags 0 or LARGE, the expected seq, a destination read as the
            # general parser reads it, no properties, a payload the limit allows, all here
            flags, number, dest_len = frame_head(data, pos)
            if flags & ~LARGE or number != seq:
                break
            at = pos + 4 + dest_len
            if at + 3 > have or data[at] or data[at + 1]:
                break
            if dest_len != raw_len or not data.startswith(raw, pos + 4):
                raw = data[pos + 4 : at]
                known = names.get(raw) or _name(raw)
                if known is None:
                    break  # the general parser reports it
                raw_len, name = dest_len, known
            if flags:  # LARGE
                if at + 6 > have:
                    break
                length, start = u32(data, at + 2)[0], at + 6
            else:
                length, start = data[at + 2], at + 3
            end = start + length
            if length > limit or end > have:
                break
            payloads.append(data[start:end])
            destinations.append(name)
            pos = end
            seq = 1 if seq == 0xFFFF else seq + 1
        if len(payloads) < 2:
            return None
        del buf[:pos]
        self._need = 1
        first = destinations[0]
        if destinations.count(first) == len(destinations):
            return MessageBatch(first_seq, first, payloads)
        return MessageBatch(first_seq, first, payloads, destinations)

    @property
    def buffered(self) -> bytes:
        """The bytes received but not yet parsed into frames."""
        return bytes(self._buf)
