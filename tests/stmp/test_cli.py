"""``msgbroker stmp ...`` against the fake STMP server of ``client_support`` and the real broker:
``pub`` and ``call`` in-process through ``main()``, ``sub`` and ``pub -`` as a person runs
them, in a subprocess (``sub`` stopped with Ctrl-C).

Tests marked ``# real broker:`` take the ``target`` fixture: they run against the fake and
against ``twistd -n msgbroker --listen stmp=... --listen stmp-ws=...`` in a subprocess (as
``tests/ssmp/test_cli.py`` does for SSMP), over TCP and WebSocket; what only the fake can
show (the requests it recorded) is checked on the fake alone, what a client sees on both.
The others need the fake's misbehaviour (no reply, refused version, chosen status) or its
test actions.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from attrs import frozen

from msgbroker.cli import build_parser, main
from msgbroker.plugins.stmp import payloads
from msgbroker.plugins.stmp.cli import _port, render_delivery, render_value
from msgbroker.plugins.stmp.client import BlockingSTMPClient, Delivery
from msgbroker.plugins.stmp.codec import Encoding, Request
from tests.ssmp.e2e_support import (
    WAIT,
    LineReader,
    parse_address,
    reactor_thread,
    stop_process,
    twistd_command,
)
from tests.stmp.client_support import ECHO, SILENT, FakeSTMPServer

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


@pytest.fixture(scope="module")
def thread():
    return reactor_thread()


@pytest.fixture(params=["tcp", "ws"])
def server(request, thread) -> Iterator[FakeSTMPServer]:
    with FakeSTMPServer(thread, ws=request.param == "ws") as running:
        yield running


# -- the real broker, for the marked tests --------------------------------------------------------


@frozen
class BrokerTarget:
    """One STMP listener of the twistd broker, shaped like :class:`FakeSTMPServer` for
    :func:`where` and the marked tests."""

    host: str
    port: int
    ws: bool


Target = FakeSTMPServer | BrokerTarget


@pytest.fixture(scope="module")
def twistd(tmp_path_factory) -> Iterator[dict[str, tuple[str, int]]]:
    """``twistd -n msgbroker`` with an ``stmp`` and an ``stmp-ws`` listener on free loopback
    ports and open login; {protocol: (host, port)}, read from its log."""
    options = (
        "--listen", "stmp=tcp:0:interface=127.0.0.1",
        "--listen", "stmp-ws=tcp:0:interface=127.0.0.1",
        "--auth", "open",
    )  # fmt: skip
    process = subprocess.Popen(
        twistd_command(*options),
        cwd=tmp_path_factory.mktemp("twistd"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = LineReader(process.stdout)
    try:
        listening: dict[str, tuple[str, int]] = {}
        while len(listening) < 2:  # the two lines come in either order
            line = log.wait_for(r"\b(stmp|stmp-ws) listening on (tcp:\S+)")
            listening[line[1]] = parse_address(line[2])
        yield listening
    finally:
        stop_process(process, signal.SIGTERM)


@pytest.fixture(params=["fake-tcp", "fake-ws", "broker-tcp", "broker-ws"])
def target(request, thread) -> Iterator[Target]:
    """The fake server or the real broker, over TCP or WebSocket."""
    kind, transport = request.param.split("-")
    ws = transport == "ws"
    if kind == "fake":
        with FakeSTMPServer(thread, ws=ws) as running:
            yield running
    else:
        host, port = request.getfixturevalue("twistd")["stmp-ws" if ws else "stmp"]
        yield BrokerTarget(host, port, ws)


def watcher(target: Target, identity: str, *topics: str) -> BlockingSTMPClient:
    """A client of ``target`` subscribed to ``topics``: it sees what a command sends."""
    client = BlockingSTMPClient(target.host, target.port, identity, ws=target.ws)
    for topic in topics:
        client.subscribe(topic)
    return client


def nothing_more(client: BlockingSTMPClient) -> bool:
    """True if no delivery is left for ``client``: a request's reply comes after anything
    the server sent before it, so what the command sent has arrived by then."""
    assert client.request("9.9.9.9").status == 0x24  # no such action: a round trip, no effect
    return client.next_delivery(0) is None


def where(server: Target) -> list[str]:
    return ["--port", str(server.port), *(["--ws"] if server.ws else [])]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def published(server: FakeSTMPServer) -> list[tuple[int, object]]:
    """(encoding, decoded payload) of every publish the server got."""
    return [
        (r.encoding, payloads.decode_payload(r.payload, r.encoding))
        for r in server.requests(payloads.PUBLISH)
    ]


# -- pub ----------------------------------------------------------------------------------------


# real broker: pub is one publish, silent on success
def test_pub_publishes_and_prints_nothing(capsys, target):
    with watcher(target, "reader", "news") as reader:
        status, out, err = run(capsys, "stmp", "pub", "news", "hello | world", *where(target))
        assert (status, out, err) == (0, "", "")
        delivery = reader.next_delivery(WAIT)
        assert (delivery.kind, delivery.topic, delivery.data) == ("mcast", "news", b"hello | world")
        assert re.fullmatch(r"cli-\d+-[0-9a-f]{4}", delivery.sender)  # the generated id
        assert nothing_more(reader)  # one publish
    if isinstance(target, FakeSTMPServer):  # what went over the wire
        assert published(target) == [(Encoding.JSON, {"topic": "news", "data": "hello | world"})]
        _, login = target.requests(payloads.LOGIN)  # the reader's, then the command's
        assert login.payload.decode() == f'{{"id":"{delivery.sender}","scheme":"open"}}'


def test_pub_bytes_that_are_not_utf8_go_as_data_b64(capsys, server):
    status, _, _ = run(capsys, "stmp", "pub", "t", "caf\udce9", *where(server))  # b"caf\xe9"
    assert status == 0
    assert published(server) == [(Encoding.JSON, {"topic": "t", "data_b64": "Y2Fm6Q=="})]


def test_pub_with_msgpack(capsys, server):
    status, _, _ = run(capsys, "stmp", "pub", "t", "x", "--encoding", "msgpack", *where(server))
    assert status == 0
    assert published(server) == [(Encoding.MSGPACK, {"topic": "t", "data": b"x"})]
    assert server.requests(payloads.LOGIN)[0].encoding == Encoding.MSGPACK


def test_pub_dash_reads_lines_from_stdin(capsys, monkeypatch, server):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\r\n\ntwo | 2\nthree")))
    status, _, _ = run(capsys, "stmp", "pub", "t", "-", "--id", "feeder", *where(server))
    assert status == 0
    assert [fields["data"] for _, fields in published(server)] == ["one", "two | 2", "three"]


# real broker: a pipe into pub -
def test_pub_dash_from_a_pipe_in_a_subprocess(target):
    with watcher(target, "reader", "piped") as reader:
        done = subprocess.run(
            [MSGBROKER, "stmp", "pub", "piped", "-", *where(target)],
            input=b"a\nb\n\nc\n", capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [reader.next_delivery(WAIT).data for _ in range(3)] == [b"a", b"b", b"c"]
        assert nothing_more(reader)  # three publishes, no more
    if isinstance(target, FakeSTMPServer):
        assert [fields["data"] for _, fields in published(target)] == ["a", "b", "c"]


# -- call ---------------------------------------------------------------------------------------


def test_call_prints_status_and_decoded_payload(capsys, server):
    status, out, err = run(capsys, "stmp", "call", "1.0.0.1", '{"q": [1, "a|b"]}', *where(server))
    assert (status, err) == (0, "")
    assert out == '0x00 Ok\n{"q": [1, "a|b"]}\n'
    [request] = server.requests(ECHO)
    assert (request.encoding, json.loads(request.payload)) == (Encoding.JSON, {"q": [1, "a|b"]})


def test_call_without_payload_sends_none_and_prints_only_the_status(capsys, server):
    status, out, _ = run(capsys, "stmp", "call", "16777217", *where(server))  # 1.0.0.1 as a number
    assert (status, out) == (0, "0x00 Ok\n")
    assert server.requests(ECHO)[0] == Request(2, ECHO, Encoding.NONE, b"")


def test_call_with_msgpack_and_raw(capsys, server):
    status, out, _ = run(
        capsys, "stmp", "call", "1.0.0.1", '{"b": "x"}', "--encoding", "msgpack", *where(server)
    )
    assert (status, out) == (0, '0x00 Ok\n{"b": "x"}\n')
    assert msgpack.unpackb(server.requests(ECHO)[0].payload) == {"b": "x"}
    status, out, _ = run(capsys, "stmp", "call", "1.0.0.1", "raw\tbytes", "--raw", *where(server))
    assert (status, out) == (0, "0x00 Ok\nraw\\tbytes\n")
    assert server.requests(ECHO)[1].encoding == Encoding.RAW


# real broker: an action nobody routes is 0x24
def test_call_not_found_exits_3(capsys, target):
    status, out, err = run(capsys, "stmp", "call", "9.9.9.9", "{}", *where(target))
    assert (status, out, err) == (3, "0x24 NotFound\n", "")


def test_call_shows_any_status_and_its_payload(capsys, server):
    status, out, _ = run(capsys, "stmp", "call", "1.0.0.5", '{"status": 153}', *where(server))
    assert (status, out) == (3, '0x99 status 0x99\n{"why": "asked"}\n')


def test_call_timeout_is_a_local_0x25(capsys, server):
    status, out, err = run(capsys, "stmp", "call", "1.0.0.3", "--timeout", "0.3", *where(server))
    assert (status, out, err) == (3, "0x25 RequestTimeout (no reply within 0.3 s)\n", "")
    assert len(server.requests(SILENT)) == 1


def test_call_with_bad_json_fails_before_connecting(capsys, server):
    status, out, err = run(capsys, "stmp", "call", "1.0.0.1", "{nope", *where(server))
    assert (status, out) == (1, "")
    assert err.startswith("msgbroker: error: PAYLOAD_JSON is not JSON: ")
    assert server.connections == []


def test_call_with_a_bad_action_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["stmp", "call", "1.2.3", "{}"])
    assert info.value.code == 2
    assert "'1.2.3' is not an action" in capsys.readouterr().err


# -- sub ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def running_sub(server: Target, *args: str) -> Iterator[tuple[subprocess.Popen[str], Any]]:
    """``msgbroker stmp sub ARGS``; yields once it is subscribed (its stderr says so)."""
    process = subprocess.Popen(
        [MSGBROKER, "stmp", "sub", *args, *where(server)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = LineReader(process.stdout), LineReader(process.stderr)
    try:
        err.wait_for(r"^msgbroker: subscribed to ")
        yield process, out, err
    finally:
        stop_process(process, signal.SIGKILL)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


# real broker: sub prints publishes, unicasts and broadcasts, and exits 0 on Ctrl-C
def test_sub_prints_deliveries_and_exits_0_on_ctrl_c(capsys, target):
    with running_sub(target, "news", "--id", "alice") as (process, out, err):
        run(capsys, "stmp", "pub", "news", "hello | world", "--id", "bob", *where(target))
        assert out.wait_for("hello").string == "bob news hello | world\n"
        run(capsys, "stmp", "pub", "news", "caf\udce9", "--id", "bob", *where(target))
        assert out.wait_for("caf").string == "bob news caf\\xe9\n"
        run(capsys, "stmp", "call", "0.0.1.5", '{"to": "alice", "data": "psst"}', "--id", "carol",
            *where(target))  # fmt: skip
        assert out.wait_for("psst").string == "carol @alice psst\n"
        # a broadcast reaches the peers sharing a topic with the sender (docs/stmp.md): a
        # one-shot call shares none, so its Ok reaches nobody; dave, in "news", reaches alice
        assert run(capsys, "stmp", "call", "0.0.1.6", '{"data": "lost"}', "--id", "eve",
                   *where(target)) == (0, "0x00 Ok\n", "")  # fmt: skip
        with watcher(target, "dave", "news") as dave:
            dave.broadcast(b"all")
        assert out.wait_for("all").string == "dave * all\n"
        assert not any("lost" in line for line in out.lines)  # eve's would have come first
        status = stop_process(process, signal.SIGINT)
        stderr = "".join(err.lines) + err.rest()
    assert status == 0
    assert "Traceback" not in stderr
    assert stderr.startswith("msgbroker: subscribed to news as alice on 127.0.0.1:")


def test_sub_shows_presence_events_only_with_presence(server):
    with running_sub(server, "room", "--presence") as (process, out, _):
        sub = server.connections[0]
        assert server.requests(payloads.SUBSCRIBE)[0].payload == (
            b'{"topic":"room","presence":true}'
        )
        server.thread.call(sub.deliver, "carol", "subscribe", "room", None)
        assert out.wait_for("carol").string == "carol joined room\n"
        server.thread.call(sub.deliver, "carol", "unsubscribe", "room", None)
        assert out.wait_for("carol").string == "carol left room\n"
    with running_sub(server, "room") as (process, out, _):
        sub = server.connections[1]
        server.thread.call(sub.deliver, "carol", "subscribe", "room", None)
        server.thread.call(sub.deliver, "erin", "mcast", "room", b"after")
        assert out.wait_for("erin").string == "erin room after\n"
        assert out.lines == ["erin room after\n"]


def test_sub_reconnects_when_the_server_goes_away_and_says_so(server):
    with running_sub(server, "t", "--id", "tess") as (process, out, err):
        server.thread.call(server.connections[0].drop)
        where = f"127.0.0.1:{server.port}"
        assert err.wait_for("lost").string == (
            f"msgbroker: lost the connection to {where} (the broker closed the connection); "
            "reconnecting\n"
        )
        assert err.wait_for("reconnected").string == (
            f"msgbroker: reconnected to {where}; subscribed to t again\n"
        )
        # the new connection logged in as before, then subscribed again
        logins = [json.loads(r.payload) for r in server.requests(payloads.LOGIN)]
        assert [login["id"] for login in logins] == ["tess", "tess"]
        assert [r.payload for r in server.requests(payloads.SUBSCRIBE)] == [b'{"topic":"t"}'] * 2
        server.thread.call(server.connections[1].deliver, "erin", "mcast", "t", b"back")
        assert out.wait_for("erin").string == "erin t back\n"
        assert process.poll() is None


# -- errors -------------------------------------------------------------------------------------


def test_connection_refused_is_one_line_and_exit_1(capsys):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status, out, err = run(capsys, "stmp", "pub", "t", "x", "--port", str(port))
    assert (status, out) == (1, "")
    assert err == f"msgbroker: error: cannot connect to 127.0.0.1:{port}: Connection refused\n"


def test_a_refused_version_is_one_line_and_exit_1(capsys, server):
    server.versions = ((0, 2),)
    status, _, err = run(capsys, "stmp", "pub", "t", "x", *where(server))
    assert status == 1
    assert err == (
        f"msgbroker: error: 127.0.0.1:{server.port} does not speak STMP 0.1 "
        "(0x35 VersionNotSupported)\n"
    )


def test_secret_login(capsys, thread, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("wrong\n")
    with FakeSTMPServer(thread, secret="pw") as server:
        status, _, err = run(capsys, "stmp", "pub", "t", "x", "--id", "alice",
                             "--secret-file", str(secret), *where(server))  # fmt: skip
        assert status == 1
        assert err == (
            f"msgbroker: error: 127.0.0.1:{server.port} refused login as 'alice' with scheme "
            "'secret' (0x21 Unauthorized; it offers: secret)\n"
        )
        secret.write_text("pw\n")
        status, _, err = run(capsys, "stmp", "pub", "t", "x", "--id", "alice",
                             "--secret-file", str(secret), *where(server))  # fmt: skip
        assert (status, err) == (0, "")
        fields = json.loads(server.requests(payloads.LOGIN)[-1].payload)
        assert fields == {"id": "alice", "scheme": "secret", "credential": "pw"}


def test_the_secret_scheme_needs_a_secret_file(capsys, server):
    status, _, err = run(capsys, "stmp", "pub", "t", "x", "--scheme", "secret", *where(server))
    assert (status, err) == (1, "msgbroker: error: the secret scheme needs --secret-file\n")


@pytest.mark.parametrize("ws", [False, True], ids=["tls", "wss"])
def test_over_tls(capsys, thread, tmp_path, ws):
    from msgbroker.tls import server_context_factory
    from tests.certs import make_pki

    pki = make_pki(tmp_path)
    context = server_context_factory(str(pki.server.cert), str(pki.server.key), None)
    with FakeSTMPServer(thread, ws=ws, tls=context) as server:
        args = ["--tls", "--ca", str(pki.ca.cert_path), *where(server)]
        status, out, err = run(capsys, "stmp", "call", "1.0.0.1", '"secure"', *args)
        assert (status, out, err) == (0, '0x00 Ok\n"secure"\n', "")
        status, _, err = run(capsys, "stmp", "pub", "t", "x", "--tls", *where(server))
        assert status == 1
        assert err.startswith(f"msgbroker: error: TLS with 127.0.0.1:{server.port} failed: ")


def test_default_ports():
    parser = build_parser()
    assert _port(parser.parse_args(["stmp", "pub", "t", "x"])) == 4445
    assert _port(parser.parse_args(["stmp", "pub", "t", "x", "--ws"])) == 4446
    assert _port(parser.parse_args(["stmp", "sub", "t", "--ws", "--port", "9"])) == 9


def test_rendering():
    assert render_delivery(Delivery("a", "mcast", "t", b"x\ny"), "me") == "a t x\\ny"
    assert render_delivery(Delivery("a", "ucast", None, b"\xff"), "me") == "a @me \\xff"
    assert render_delivery(Delivery("a", "bcast", None, b""), "me") == "a * "
    assert render_value({"b": b"\x00", "l": [1.5, None]}) == '{"b": "\\\\x00", "l": [1.5, null]}'
    assert render_value(b"bin\x01") == "bin\\x01"


def test_stmp_is_registered_beside_ssmp(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "ssmp" in out and "stmp" in out
