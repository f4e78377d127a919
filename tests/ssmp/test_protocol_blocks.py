"""Pipelined MCASTs to changing topics through the SSMP server (a block: one event, no
Message each): answers, deliveries and hooks as for the same MCASTs one by one."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig
from msgbroker.testing import make_broker
from tests.ssmp.test_protocol import PerRequestGuard, PerTopicGuard, RoutedRecorder, login


@pytest.mark.parametrize("guard", [None, PerTopicGuard, PerRequestGuard])
def test_pipelined_mcasts_to_changing_topics_are_answered_and_delivered_in_order(guard):
    """A block of MCASTs each to another topic (one event, no Message each) gives what the
    same MCASTs sent one by one give: the answers in order, each topic's subscribers their
    messages in order, the hooks asked about each."""
    plugins = [guard()] if guard is not None else []
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=plugins)
    a, b, c = login(broker, "a"), login(broker, "b"), login(broker, "c")
    b.send(b"SUBSCRIBE t\nSUBSCRIBE u\nSUBSCRIBE secret\n")
    c.send(b"SUBSCRIBE u\n")
    b.received(), c.received()
    a.send(b"MCAST t 1\nMCAST u 2\nMCAST secret 3\nMCAST t 4\nMCAST nobody 5\nMCAST u 6\n")
    secret = b"200\n" if guard is None else b"405\n"
    assert a.received() == b"200\n200\n" + secret + b"200\n200\n200\n"
    got_secret = b"000 a MCAST secret 3\n" if guard is None else b""
    assert b.received() == (
        b"000 a MCAST t 1\n000 a MCAST u 2\n" + got_secret + b"000 a MCAST t 4\n000 a MCAST u 6\n"
    )
    assert c.received() == b"000 a MCAST u 2\n000 a MCAST u 6\n"
    assert broker.hub.stats.routed == (6 if guard is None else 5)


def test_pipelined_mcasts_to_changing_topics_are_each_seen_by_message_routed():
    rec = RoutedRecorder()
    broker = make_broker(BrokerConfig(auth=("open",)), plugins=[rec])
    a, b = login(broker, "a"), login(broker, "b")
    b.send(b"SUBSCRIBE t\nSUBSCRIBE u\n")
    b.received()
    a.send(b"MCAST t 1\nMCAST u 2\nMCAST v 3\n")
    assert a.received() == b"200\n200\n200\n"
    assert rec.payloads == [(b"1", {"ssmp": 1}), (b"2", {"ssmp": 1}), (b"3", {})]
    assert b.received() == b"000 a MCAST t 1\n000 a MCAST u 2\n"
