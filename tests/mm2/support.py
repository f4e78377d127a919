"""Helpers the Micromessage2 codec tests share: feeding decoders whole, split at every
point and one byte at a time, and requiring the same outcome each way."""

from __future__ import annotations

import itertools

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.mm2.codec import FrameDecoder, HandshakeDecoder


def all_splittings(data):
    """Whole, one byte at a time, and every 2-way split."""
    yield [data]
    yield [data[i : i + 1] for i in range(len(data))]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


def split_at(data, points):
    """``data`` cut at ``points`` (taken modulo its length + 1)."""
    cuts = sorted({p % (len(data) + 1) for p in points})
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def feed_frames(chunks, **kwargs):
    """(frames, raised, unparsed bytes): feeding stops at the first RemoteProtocolError;
    any other exception escapes and fails the test."""
    decoder = FrameDecoder(**kwargs)
    frames = []
    for chunk in chunks:
        try:
            frames.extend(decoder.feed(chunk))
        except RemoteProtocolError:
            return frames, True, None
    return frames, False, decoder.buffered


def decode_frames(data, **kwargs):
    """The outcome of a frame stream fed whole, required to be the same under every
    splitting (one byte at a time included)."""
    whole = feed_frames([data], **kwargs)
    for chunks in all_splittings(data):
        assert feed_frames(chunks, **kwargs) == whole, [len(c) for c in chunks]
    return whole


def feed_handshake(chunks):
    """(message or None, raised, the bytes after the message) for a handshake step fed in
    ``chunks``: its trailing data plus the chunks not fed (they belong to the next decoder)."""
    decoder = HandshakeDecoder()
    for index, chunk in enumerate(chunks):
        try:
            message = decoder.feed(chunk)
        except RemoteProtocolError:
            return None, True, None
        if message is not None:
            return message, False, decoder.trailing_data + b"".join(chunks[index + 1 :])
    return None, False, b""


def decode_handshake(data):
    """A handshake step fed whole, required to be the same under every splitting."""
    whole = feed_handshake([data])
    for chunks in all_splittings(data):
        assert feed_handshake(chunks) == whole, [len(c) for c in chunks]
    return whole
