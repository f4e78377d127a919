"""How the journal stores a name that is not valid Unicode text.

The broker's names (topics, identities, auth schemes, reasons) are Python ``str``, and not
all of them can be written as UTF-8, which Parquet's string columns require: an sbus
routing key ``k\\xff`` becomes the topic ``'k\\udcff'`` (``bytes.decode('utf-8',
'surrogateescape')``), and a JSON ``"x\\udcff"`` in an STMP login is the same lone
surrogate. Such a value is stored *escaped*, and the row's ``escaped`` column lists the
columns that were; every other value is stored as it is. The escape (see docs/journal.md):

- ``\\`` becomes ``\\\\``;
- a surrogate U+DC80..U+DCFF (``surrogateescape``'s stand-in for an undecodable byte
  ``0xHH``) becomes ``\\xHH``: the bytes read as by ``bytes.decode('utf-8',
  'backslashreplace')``;
- any other surrogate U+D800..U+DFFF becomes ``\\uHHHH``;
- everything else stays. Hex digits are lower case.

It is lossless (:func:`unescape` gives the name back exactly) and an escaped value is valid
text, readable and groupable like any other. An escaped value can equal a name that was
stored as it is (a topic literally called ``k\\xff``); the ``escaped`` column tells them
apart.
"""

from __future__ import annotations

import re

_SURROGATES = re.compile(r"[\\\ud800-\udfff]")
_ESCAPES = re.compile(r"\\(?:(\\)|x([0-9a-f]{2})|u([0-9a-f]{4}))")


def needs_escape(name: str) -> bool:
    """Whether ``name`` cannot be written as UTF-8 (it holds a surrogate)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def escape(name: str) -> str:
    """``name`` as stored in an escaped column (valid UTF-8 whatever ``name`` holds)."""
    return _SURROGATES.sub(_escape_one, name)


def _unescape_one(match: re.Match[str]) -> str:
    backslash, byte, code = match.groups()
    if backslash:
        return "\\"
    if byte:
        return chr(0xDC00 + int(byte, 16))
    return chr(int(code, 16))


def unescape(stored: str) -> str:
    """The name an escaped value stands for (the inverse of :func:`escape`)."""
    return _ESCAPES.sub(_unescape_one, stored)
