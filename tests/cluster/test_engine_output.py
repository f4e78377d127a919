"""``msgbroker.engineoutput.EngineOutput``: an engine connection's output is one write per
flush; while the server does not read (paused) it is held, bounded by ``max_buffer`` except
for what is forced; resuming writes what was held in one go; a lost connection clears it.
The Redis and NATS engines' use of it is tested end to end (a paused server: drop and
count, local delivery goes on) in test_redis_faults.py and test_nats_faults.py."""

from __future__ import annotations

from msgbroker.engineoutput import EngineOutput


def test_one_write_per_flush() -> None:
    writes: list[bytes] = []
    output = EngineOutput(100, writes.append)
    output.queue(b"a")
    output.queue_all([b"b", b"c"])
    assert output.buffered == 3 and writes == []
    output.flush()
    output.flush()  # nothing more queued: no empty write
    assert writes == [b"abc"] and output.buffered == 0


def test_held_while_paused_within_max_buffer_then_written_at_once() -> None:
    writes: list[bytes] = []
    output = EngineOutput(10, writes.append)
    output.pause()
    assert output.fits(6)
    output.queue(b"123456")
    output.flush()
    assert writes == [] and output.held_bytes == 6
    assert output.fits(4) and not output.fits(5)  # queued and held count together
    assert output.fits(50, force=True)  # the node's own state goes regardless
    output.queue(b"xy")
    output.flush()
    output.resume()
    assert writes == [b"123456xy"] and output.buffered == 0
    assert output.fits(1_000)  # reading again: nothing is refused


def test_a_lost_connection_writes_nothing_held() -> None:
    writes: list[bytes] = []
    output = EngineOutput(10, writes.append)
    output.pause()
    output.queue(b"held")
    output.flush()
    output.queue(b"queued")
    output.clear()
    output.resume()
    output.flush()
    assert writes == [] and output.buffered == 0


def test_nothing_is_written_before_the_connection_is_made() -> None:
    output = EngineOutput(10)
    output.queue(b"early")
    output.flush()  # no transport yet: kept for the first flush after it
    writes: list[bytes] = []
    output.write = writes.append
    output.flush()
    assert writes == [b"early"]
