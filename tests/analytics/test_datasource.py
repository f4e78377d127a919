"""The ``msgbroker`` sink's pieces and the ``stream`` command line, without starting Spark
(PySpark must be installed: the data source module subclasses its classes)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from msgbroker.analytics.datasource import (
    SinkError,
    local_path,
    parse_broker,
    read_state,
    state_path,
    to_message,
    write_state,
)
from msgbroker.analytics.stream import add_stream_arguments, main
from msgbroker.cli import CommandError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4444", ("127.0.0.1", 4444)),
        ("broker.example", ("broker.example", 4444)),
        ("[::1]:5000", ("::1", 5000)),
        ("[::1]", ("::1", 4444)),
    ],
)
def test_parse_broker_accepts_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_broker(text) == expected


@pytest.mark.parametrize("text", [":4444", "host:port", "host:0", "host:70000"])
def test_parse_broker_rejects_nonsense(text: str) -> None:
    with pytest.raises(SinkError, match="HOST:PORT"):
        parse_broker(text)


def test_to_message_encodes_text_and_skips_what_ssmp_cannot_carry() -> None:
    assert to_message("_stats/topic/a", "héllo") == ("_stats/topic/a", "héllo".encode())
    assert to_message("t", b"\x00\nbinary") == ("t", b"\x00\nbinary")
    assert to_message("bad topic", "x") is None
    assert to_message("x" * 65, "x") is None
    assert to_message(None, "x") is None
    assert to_message("t", "") is None
    assert to_message("t", "x" * 1025) is None
    assert to_message("t", None) is None


def test_state_file_round_trips_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state"
    assert read_state(path) is None
    write_state(path, 3)
    write_state(path, 4)
    assert read_state(path) == 4
    assert [p.name for p in path.parent.iterdir()] == ["state"]  # no temporaries left


def test_unreadable_state_file_is_an_error_not_a_guess(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_text("{not json")
    with pytest.raises(SinkError, match="unreadable"):
        read_state(path)


def test_state_path_defaults_into_the_checkpoint_location(tmp_path: Path) -> None:
    assert state_path({"state": "/x/s"}) == Path("/x/s")
    assert state_path({"checkpointLocation": f"file:{tmp_path}"}) == tmp_path / (
        "msgbroker-sink.state"
    )
    with pytest.raises(SinkError, match="'state' option"):
        state_path({})
    with pytest.raises(SinkError, match="not a local path"):
        local_path("hdfs://nn/checkpoint")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_stream_arguments(parser)
    return parser.parse_args(argv)


def test_stream_arguments_defaults_and_options() -> None:
    args = parse("journal")
    assert (args.journal_dir, args.broker, args.checkpoint) == (
        Path("journal"),
        "127.0.0.1:4444",
        None,
    )
    assert (args.window, args.watermark, args.trigger, args.master) == (10.0, 2.0, 1.0, "local[*]")
    assert args.action_run is main
    args = parse("j", "--broker", "h:1", "--checkpoint", "c", "--window", "2.5", "--watermark", "0")
    assert (args.broker, args.checkpoint, args.window, args.watermark) == (
        "h:1",
        Path("c"),
        2.5,
        0.0,
    )


def test_stream_arguments_reject_a_non_positive_window(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("journal", "--window", "0")
    assert "not a positive number of seconds" in capsys.readouterr().err


def test_stream_fails_in_one_line_when_the_broker_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CommandError, match=f"cannot connect to the broker at 127.0.0.1:{port}"):
        main(parse(str(tmp_path), "--broker", f"127.0.0.1:{port}"))


def test_stream_fails_in_one_line_without_a_journal_directory(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="is not a directory"):
        main(parse(str(tmp_path / "missing")))
