"""``--log-format json``: one JSON object per line, from twistd's own observer, for a log
shipper to read without parsing text."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess

import pytest
from twisted.logger import Logger
from twisted.python import log as legacy_log

from msgbroker.config import build_config
from msgbroker.errors import ConfigError
from msgbroker.logs import json_line
from tests.ops.logcapture import captured_log
from tests.ssmp.e2e_support import LineReader, stop_process, twistd_command


def one_event(emit):
    with captured_log() as log:
        emit(Logger(namespace="msgbroker.test"))
    ((_, _, event),) = log
    return event


def test_a_line_has_time_level_namespace_message_and_the_plain_fields():
    event = one_event(
        lambda log: log.info(
            "{protocol} listening on {address}",
            protocol="ssmp",
            address="tcp:127.0.0.1:4444",
            count=3,
            ratio=0.5,
            flag=True,
            nothing=None,
            thing=object(),  # an object could say anything: left out
        )
    )
    line = json_line(event)
    assert line.endswith("\n") and "\n" not in line[:-1]
    record = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", record.pop("time"))
    assert record == {
        "level": "info",
        "namespace": "msgbroker.test",
        "message": "ssmp listening on tcp:127.0.0.1:4444",
        "protocol": "ssmp",
        "address": "tcp:127.0.0.1:4444",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "nothing": None,
    }


def test_a_failure_carries_its_traceback_and_odd_values_stay_valid_json():
    def fail(log):
        try:
            int("boom")
        except ValueError:
            log.failure("handler for {action} failed", action="x", nan=float("nan"))

    record = json.loads(json_line(one_event(fail)))
    assert record["level"] == "critical"
    assert record["message"] == "handler for x failed"
    assert "ValueError: invalid literal for int() with base 10: 'boom'" in record["traceback"]
    assert record["nan"] == "nan"
    # names that are not UTF-8 (surrogate escapes) are escaped, not an encoding error
    event = one_event(lambda log: log.warn("{name}", name="x\udcff"))
    assert json.loads(json_line(event))["name"] == "x\udcff"
    assert json_line(event).isascii()


def test_a_legacy_event_has_its_text_and_not_its_bookkeeping():
    with captured_log() as log:
        legacy_log.msg("hello", "world")  # what older Twisted code and libraries call
    ((_, _, event),) = log
    record = json.loads(json_line(event))
    assert record["message"] == "hello world" and record["level"] == "info"
    assert not {"isError", "system", "format"} & set(record)


def test_log_format_is_an_option_and_a_key(tmp_path):
    assert build_config(None, {"log-format": "json"}).log_format == "json"
    toml = tmp_path / "broker.toml"
    toml.write_text('log-format = "json"\nshutdown-grace = 2.5\n')
    config = build_config(str(toml), {})
    assert (config.log_format, config.shutdown_grace) == ("json", 2.5)
    assert build_config(None, {}).log_format == "text"
    with pytest.raises(ConfigError, match="bad log-format 'xml': choose one of text, json"):
        build_config(None, {"log-format": "xml"})
    with pytest.raises(ConfigError, match="shutdown-grace must be 0 or more"):
        build_config(None, {"shutdown-grace": "-1"})


def test_twistd_writes_every_line_as_json():
    process = subprocess.Popen(
        twistd_command(
            "--listen", "ssmp=tcp:0:interface=127.0.0.1", "--auth", "open", "--log-format", "json"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = LineReader(process.stdout)
    try:
        match = log.wait_for(r'"message": "ssmp listening on tcp:127\.0\.0\.1:(\d+)"')
        port = int(match.group(1))
        bad = socket.create_connection(("127.0.0.1", port), timeout=10)
        bad.sendall(b"LOGIN alice open\n")
        assert bad.recv(4) == b"200\n"
        process.send_signal(signal.SIGUSR1)
        log.wait_for(r'"message": "status: ')
        bad.close()
    finally:
        assert stop_process(process, signal.SIGTERM) in (0, -signal.SIGTERM)
    rest = log.rest()
    assert rest  # the shutdown lines
    records = [json.loads(line) for line in log.lines]  # every line is one JSON object
    listening = next(r for r in records if r["message"].startswith("ssmp listening"))
    assert listening["protocol"] == "ssmp"
    assert listening["address"] == f"tcp:127.0.0.1:{port}"
    assert listening["namespace"] == "msgbroker" and listening["level"] == "info"
    assert any(r["message"] == f"ssmp stopped listening on tcp:127.0.0.1:{port}" for r in records)
    assert all(r["level"] != "debug" for r in records)
