"""The pieces of a graceful shutdown, without sockets: an output says when what it holds
is written (``when_drained``), a retired session leaves the routing core but keeps its
output, and input to a closing connection is not handled."""

from __future__ import annotations

from msgbroker.reasons import CloseReason
from msgbroker.testing import connect, make_broker
from tests.framework.test_output import make_output


def test_when_drained_is_called_at_once_when_nothing_is_held():
    session, output, wire, _, batcher = make_output(max_backlog=100)
    session.send(b"batched")
    calls = []
    output.when_drained(lambda: calls.append(bytes(wire.data)))
    assert calls == [b"batched"]  # the batch was written first


def test_when_drained_waits_for_the_held_backlog_to_be_written():
    session, output, wire, _, batcher = make_output(max_backlog=100)
    wire.fill()
    session.send(b"1234")
    batcher.flush()
    assert output.held_bytes == 4
    calls = []
    output.when_drained(lambda: calls.append(bytes(wire.data)))
    assert calls == []
    wire.drain()
    assert calls == [b"1234"]
    wire.drain()  # once only
    assert calls == [b"1234"]


def test_a_stopped_output_never_calls_when_drained():
    session, output, wire, _, batcher = make_output(max_backlog=100)
    wire.fill()
    session.send(b"1234")
    batcher.flush()
    calls = []
    output.when_drained(lambda: calls.append(1))
    output.stop()
    wire.drain()
    output.when_drained(lambda: calls.append(2))
    assert calls == []


def test_a_retired_session_leaves_the_hub_keeps_its_output_and_reads_nothing_more():
    broker = make_broker()
    watcher = connect(broker, "ssmp")
    watcher.send(b"LOGIN w open\nSUBSCRIBE t PRESENCE\n")
    member = connect(broker, "ssmp")
    member.send(b"LOGIN m open\nSUBSCRIBE t\n")
    assert member.received().endswith(b"200\n200\n")
    watcher.received()
    session = member.session
    broker.retire(session)
    broker.batcher.flush()
    assert session.close_reason is CloseReason.SHUTDOWN
    assert "m" not in broker.hub.identities and "t" in broker.hub.topics
    assert watcher.received() == b"000 m UNSUBSCRIBE t\n"  # presence, as at any close
    assert session in broker.sessions  # until its connection is gone
    member.send(b"SUBSCRIBE u\nMCAST t hello\n")  # not handled: it is closing
    assert member.received() == b""
    assert "u" not in broker.hub.topics
    assert watcher.received() == b""


def test_broker_stopping_runs_while_it_still_listens_and_stopped_once_all_is_closed():
    from msgbroker import hookimpl
    from msgbroker.plugins.ssmp.blocking import BlockingSSMPClient
    from msgbroker.service import ListenerService
    from tests.ssmp.e2e_support import running_broker

    seen = []

    class Watcher:
        @hookimpl
        def msgbroker_broker_stopping(self, broker):
            listening = [s.port is not None for s in service if isinstance(s, ListenerService)]
            seen.append(("stopping", len(broker.sessions), listening))

        @hookimpl
        def msgbroker_broker_stopped(self, broker):
            seen.append(("stopped", len(broker.sessions), []))

    with running_broker() as running:
        service = running.service
        client = BlockingSSMPClient(running.host, running.port, "alice")
        running.call(service.broker.add_plugin, Watcher())
        running.call(service.stopService)
        client.close()
    assert seen == [("stopping", 1, [True]), ("stopped", 0, [])]
