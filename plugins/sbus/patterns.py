"""sbus routing keys and patterns as plain functions (sbus.txt, "Routing keys" and "Secret
messages", as fixed by DECISIONS.md): matching, secret ``!/cred/`` keys, and the mapping
between keys (bytes) and the broker's topics (str). Sans-IO; no index here.
"""

from __future__ import annotations

import re

#: keys starting with this are secret: only subscribers with the right credentials see them
SECRET_PREFIX = b"!/cred/"

_STAR = ord("*")
_SLASH = ord("/")
_SECRET = re.compile(rb"!/cred/([0-9]*)/([0-9]*)/([0-9]*)/(.*)", re.DOTALL)


def key_to_topic(key: bytes) -> str:
    """The broker topic of routing key ``key``: ``key.decode("utf-8", "surrogateescape")``,
    lossless, so :func:`topic_to_key` gives ``key`` back."""
    return key.decode("utf-8", "surrogateescape")


def topic_to_key(topic: str) -> bytes:
    """The routing key of broker topic ``topic``: ``topic.encode("utf-8",
    "surrogateescape")``. ValueError when no sbus key can carry it: a surrogate that
    surrogateescape does not map back to a byte, or a NUL (which no key may contain)."""
    key = topic.encode("utf-8", "surrogateescape")  # UnicodeEncodeError is a ValueError
    if b"\0" in key:
        raise ValueError(f"an sbus routing key cannot contain a NUL: {topic!r}")
    return key


def is_secret(key: bytes) -> bool:
    """Whether ``key`` is secret: it starts with ``!/cred/``."""
    return key.startswith(SECRET_PREFIX)


def secret_fields(key: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """``(gid, uid, pid, rest)`` of a key or pattern of the form
    ``!/cred/<gid>/<uid>/<pid>/<rest>`` whose three fields are decimal digits or empty
    (sbus.txt's ``^!/cred/\\([0-9]*\\)/\\([0-9]*\\)/\\([0-9]*\\)/\\(.*\\)$``); None for anything
    else, truncated forms (``!/cred/1/2/3``) and ``*`` in a field included."""
    found = _SECRET.fullmatch(key)
    if found is None:
        return None
    gid, uid, pid, rest = found.groups()
    return gid, uid, pid, rest


def credentials(gid: int, uid: int, pid: int) -> bytes:
    """A client's credentials as sbus writes them: ``!/cred/<gid>/<uid>/<pid>``."""
    return b"!/cred/%d/%d/%d" % (gid, uid, pid)


def resolve_subscription(pattern: bytes, gid: int, uid: int, pid: int) -> bytes | None:
    """The pattern a ``SUB pattern`` from a client with SO_PEERCRED ``gid``/``uid``/``pid``
    stores, or None when that client may not subscribe to it (and is disconnected).

    A pattern not starting with ``!/cred/`` is returned unchanged. A secret pattern must have
    the full ``!/cred/<gid>/<uid>/<pid>/`` form (:func:`secret_fields`); each field must be
    empty or the client's own value written in decimal without leading zeros, and an empty
    field is filled with the client's own value.
    """
    if not is_secret(pattern):
        return pattern
    fields = secret_fields(pattern)
    if fields is None:
        return None
    *given, rest = fields
    own = [b"%d" % value for value in (gid, uid, pid)]
    if any(field not in (b"", mine) for field, mine in zip(given, own, strict=True)):
        return None
    return b"!/cred/" + b"/".join(own) + b"/" + rest


def _may_see_secret(pattern: bytes) -> bool:
    fields = secret_fields(pattern)
    return fields is not None and all(fields[:3])


def matches(pattern: bytes, key: bytes) -> bool:
    """Whether routing key ``key`` matches subscription ``pattern``.

    - Bytes other than ``*`` and a final ``/`` match themselves.
    - ``*`` matches every byte up to the next ``/`` of the key (or its end), greedily and
      never backtracking: ``a*b`` matches no key, ``a/*/c`` matches ``a//c``.
    - A ``*`` that meets the end of the key matches nothing, as in the reference server
      (DECISIONS.md): ``a*`` does not match ``a``, ``a/*`` not ``a/``, ``*`` not the empty
      key, and a pattern ending in ``**`` no key (its last ``*`` always meets the end); a
      ``*`` followed by more pattern may still match zero bytes (``*/`` matches ``/x``).
    - A pattern ending in ``/`` matches that ``/`` and anything after it: ``a/*/c/`` matches
      ``a/b/c/`` and ``a/b/c/d/e``, not ``a/b/c`` or ``a/c/d``.
    - Otherwise the pattern must match the whole key.
    - The empty pattern matches every key, except a secret one.
    - A secret key (``!/cred/...``) matches only a pattern with a full ``!/cred/`` prefix
      whose gid, uid and pid are all given (as :func:`resolve_subscription` stores them):
      never the empty pattern, ``*`` or ``!/*/...``.
    """
    if key.startswith(SECRET_PREFIX) and not _may_see_secret(pattern):
        return False
    if not pattern:
        return True
    at, end, last = 0, len(key), len(pattern) - 1
    for index, byte in enumerate(pattern):
        if byte == _STAR:
            if at == end:
                return False
            slash = key.find(b"/", at)
            at = end if slash < 0 else slash
        elif byte == _SLASH and index == last:
            return at < end and key[at] == _SLASH
        elif at < end and key[at] == byte:
            at += 1
        else:
            return False
    return at == end
