"""The SSMP request decoder's runs (pipelined MCASTs to one topic) and blocks (MCASTs to
changing topics): how requests group, where a group ends, and what each event gives."""

from __future__ import annotations

import itertools

import pytest

from msgbroker.errors import RemoteProtocolError
from msgbroker.plugins.ssmp import codec
from msgbroker.plugins.ssmp.codec import Mcast, RequestDecoder
from tests.ssmp.test_codec import TEXT_1024, requests


def test_pipelined_text_mcasts_to_one_topic_come_out_as_a_run():
    block = b"MCAST t a\nMCAST t b c\nMCAST t " + TEXT_1024 + b"\n"
    events = RequestDecoder().feed(block + b"MCAST t " + TEXT_1024 + b"x\n")
    run = next(events)
    assert run == codec.McastRun("t", block, 3)
    with pytest.raises(RemoteProtocolError):  # the 1025-byte payload is not in the run
        next(events)
    assert run.payloads() == [b"a", b"b c", TEXT_1024]
    assert run.expand() == [
        Mcast("t", b"a", b"MCAST t a"),
        Mcast("t", b"b c", b"MCAST t b c"),
        Mcast("t", TEXT_1024, b"MCAST t " + TEXT_1024),
    ]


def test_run_is_yielded_before_the_bad_mcast_that_ends_it():
    events = RequestDecoder().feed(b"MCAST t a\nMCAST t b\nMCAST t \nPING\n")
    assert next(events) == codec.McastRun("t", b"MCAST t a\nMCAST t b\n", 2)
    with pytest.raises(RemoteProtocolError):
        next(events)


def test_runs_break_at_another_topic_or_a_binary_payload():
    data = b"MCAST t a\nMCAST t b\nMCAST u c\nMCAST t \x00\x00d\nMCAST t e\nMCAST t f\n"
    assert [type(e).__name__ for e in RequestDecoder().feed(data)] == [
        "McastRun",
        "Mcast",
        "Mcast",
        "McastRun",
    ]
    assert [(e.topic, e.payload) for e in requests(data)] == [
        ("t", b"a"),
        ("t", b"b"),
        ("u", b"c"),
        ("t", b"d"),
        ("t", b"e"),
        ("t", b"f"),
    ]


def test_pipelined_text_mcasts_to_changing_topics_come_out_as_a_block():
    block = b"MCAST t a\nMCAST u b c\nMCAST t " + TEXT_1024 + b"\nMCAST v d\n"
    events = list(RequestDecoder().feed(block))
    assert events == [codec.McastBlock(block, ["t", "u", "t", "v"], 4)]
    assert events[0].payloads() == [b"a", b"b c", TEXT_1024, b"d"]
    assert events[0].prefixed(b"000 me ") == [
        b"000 me MCAST t a\n",
        b"000 me MCAST u b c\n",
        b"000 me MCAST t " + TEXT_1024 + b"\n",
        b"000 me MCAST v d\n",
    ]
    assert events[0].expand() == requests(block)


def test_a_block_ends_where_a_run_starts_and_at_anything_else():
    data = (
        b"MCAST t a\nMCAST u b\nMCAST v c\nMCAST v d\n"  # a block, then a run to v
        b"MCAST w e\nMCAST x f\nMCAST y \x00\x00g\n"  # a block, then a binary payload
        b"MCAST z h\nPING\nMCAST t i\nMCAST u \n"  # one MCAST, PING, one, then a bad one
    )
    events = RequestDecoder().feed(data)
    kinds = [(type(e).__name__, getattr(e, "count", 1)) for e in itertools.islice(events, 7)]
    with pytest.raises(RemoteProtocolError):  # "MCAST u " has no payload
        next(events)
    assert kinds == [
        ("McastBlock", 2),
        ("McastRun", 2),
        ("McastBlock", 2),
        ("Mcast", 1),
        ("Mcast", 1),
        ("Ping", 1),
        ("Mcast", 1),
    ]


def test_a_block_reads_topics_from_line_starts_only_and_keeps_carriage_returns():
    block = b"MCAST t x MCAST y z\nMCAST u a\rb\x0bc\nMCAST v MCAST w \n"
    (event,) = RequestDecoder().feed(block)
    assert event.topics == ["t", "u", "v"]
    assert event.payloads() == [b"x MCAST y z", b"a\rb\x0bc", b"MCAST w "]
    assert event.prefixed(b"000 me ") == [
        b"000 me MCAST t x MCAST y z\n",
        b"000 me MCAST u a\rb\x0bc\n",
        b"000 me MCAST v MCAST w \n",
    ]


def test_a_block_takes_no_topic_the_id_grammar_refuses():
    bad = b"MCAST t a\nMCAST u!x b\n"
    events = RequestDecoder().feed(bad)
    assert next(events) == Mcast("t", b"a", b"MCAST t a")
    with pytest.raises(RemoteProtocolError):
        next(events)
