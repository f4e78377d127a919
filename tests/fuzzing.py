"""Hypothesis strategies the codec fuzzers of every protocol share."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def mutated(draw, data):
    """``data`` after a few byte flips, insertions, deletions and a possible truncation."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        at = draw(st.integers(0, len(data)))
        if op == "insert":
            data[at:at] = bytes([draw(st.integers(0, 255))])
        elif at < len(data):
            if op == "flip":
                data[at] ^= 1 << draw(st.integers(0, 7))
            elif op == "set":
                data[at] = draw(st.integers(0, 255))
            else:
                del data[at]
    if draw(st.booleans()):
        del data[draw(st.integers(0, len(data))) :]
    return bytes(data)
