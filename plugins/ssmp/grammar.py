"""What SSMP's requests and replies share: its limits, identifiers and payloads.

Both directions' decoders build on this (:mod:`.codec` for requests, :mod:`.replies` for
what the server sends), so neither imports the other; :mod:`.codec` is the one module to
import, and re-exports these.
"""

from __future__ import annotations

import re

from msgbroker.errors import RemoteProtocolError

MAX_PAYLOAD = 1024
MAX_ID = 64
MAX_VERB = 16
#: the longest valid message: LOGIN id id binary-payload LF
MAX_MESSAGE = len(b"LOGIN ") + MAX_ID + 1 + MAX_ID + 1 + 2 + MAX_PAYLOAD + 1

_ID_RE = re.compile(rb"[A-Za-z0-9.:@/_\-+=~]{1,64}")
_VERB_RE = re.compile(rb"[A-Z]{1,16}")
_ID_STR_RE = re.compile(r"[A-Za-z0-9.:@/_\-+=~]{1,64}")
_BINARY_FIRST = frozenset(b"\x00\x01\x02\x03")
_LF = 10


class IdCache:
    """Validated ids, bytes -> str. Topics repeat, so validation is mostly a dict hit."""

    __slots__ = ("_known", "_limit")

    def __init__(self, limit: int = 4096) -> None:
        self._known: dict[bytes, str] = {}
        self._limit = limit

    def get(self, raw: bytes, what: str) -> str:
        known = self._known.get(raw)
        if known is not None:
            return known
        if _ID_RE.fullmatch(raw) is None:
            raise RemoteProtocolError(f"bad {what}: {raw[:80]!r}")
        if len(self._known) >= self._limit:
            self._known.clear()
        value = self._known[raw] = raw.decode("ascii")
        return value

    def get_all(self, raws: list[bytes], what: str) -> list[str]:
        """:meth:`get` of each of ``raws``."""
        known, get = self._known, self.get
        return [known.get(raw) or get(raw, what) for raw in raws]


def is_valid_id(value: str) -> bool:
    """True if ``value`` can be an SSMP identifier or topic."""
    return _ID_STR_RE.fullmatch(value) is not None


def encode_payload(data: bytes) -> bytes | None:
    """The wire form of ``data``: as text when it can be, else binary; ``None`` if SSMP
    cannot carry it (empty or over 1024 bytes)."""
    size = len(data)
    if not 0 < size <= MAX_PAYLOAD:
        return None
    if data[0] > 3 and b"\n" not in data:
        return data
    return (size - 1).to_bytes(2, "big") + data


def _payload_end(buf: bytes, start: int, nl: int) -> tuple[int, bytes] | None:
    """Parse the payload starting at ``start``; ``nl`` is the first LF at or after ``start``
    (or -1). Returns (index of its terminating LF, data), or ``None`` when more bytes are
    needed. Raises for a malformed payload."""
    if start >= len(buf):
        return None
    first = buf[start]
    if first <= 3:
        if start + 2 > len(buf):
            return None
        size = ((first << 8) | buf[start + 1]) + 1
        if size > MAX_PAYLOAD:
            raise RemoteProtocolError("binary payload longer than 1024 bytes")
        end = start + 2 + size
        if end >= len(buf):
            return None
        if buf[end] != _LF:
            raise RemoteProtocolError("binary payload not followed by LF")
        return end, buf[start + 2 : end]
    if nl < 0:
        return None
    if nl == start:
        raise RemoteProtocolError("empty payload")
    if nl - start > MAX_PAYLOAD:
        raise RemoteProtocolError("text payload longer than 1024 bytes")
    return nl, buf[start:nl]
