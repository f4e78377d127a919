"""``msgbroker mm2 ...`` against a real broker: ``twistd -n msgbroker`` with a plain and a
TLS Micromessage2 listener, started once for the module. ``pub`` and the errors run
in-process through ``main()``; ``sub`` and ``pub -`` from a pipe run as a person runs them,
in a subprocess (``sub`` stopped with Ctrl-C). What a command sent is seen by a blocking
client (a watcher); that nothing more came is shown by a round trip through the broker.
A running ``sub`` has printed everything sent to it before a unicast it prints last (one
connection's messages arrive in order). Every test uses identities of its own: the broker
is shared.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen

from msgbroker.cli import build_parser, main
from msgbroker.plugins.mm2.blocking import BlockingMM2Client
from msgbroker.plugins.mm2.cli import extensions, render_message
from msgbroker.plugins.mm2.client import Message, MM2ConnectionClosed
from tests.certs import make_pki
from tests.mm2.client_support import SETTLE, settle
from tests.ssmp.e2e_support import (
    WAIT,
    LineReader,
    parse_address,
    stop_process,
    twistd_command,
)

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


@frozen
class Broker:
    """The twistd broker: its plain and TLS ports, and the CA that signed its certificate."""

    port: int
    tls_port: int
    ca: str


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[Broker]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    options = (
        "--listen", "mm2=tcp:0:interface=127.0.0.1",
        "--listen", "mm2=tls:0:interface=127.0.0.1",
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
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
        ports: dict[str, int] = {}
        while len(ports) < 2:  # the two lines come in either order
            line = log.wait_for(r"\bmm2 listening on ((tcp|tls):\S+)")
            ports[line[2]] = parse_address(line[1])[1]
        yield Broker(ports["tcp"], ports["tls"], str(pki.ca.cert_path))
    finally:
        stop_process(process, signal.SIGTERM)


def where(broker: Broker) -> list[str]:
    return ["--port", str(broker.port)]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def pub(capsys, broker: Broker, *argv: str) -> None:
    """``msgbroker mm2 pub ARGV``, which must succeed silently."""
    assert run(capsys, "mm2", "pub", *argv, *where(broker)) == (0, "", "")


@contextlib.contextmanager
def watcher(broker: Broker, identity: str, *destinations: str) -> Iterator[BlockingMM2Client]:
    """A client subscribed to ``destinations`` (in force): it sees what a command sends."""
    with BlockingMM2Client("127.0.0.1", broker.port, identity, timeout=WAIT) as client:
        for destination in destinations:
            client.subscribe(destination)
        settle(client)
        yield client


def nothing_more(client: BlockingMM2Client) -> bool:
    """True if nothing is left for ``client``: its round trip comes back next."""
    client.unicast(client.session.hello.identity, SETTLE)
    message = client.next_message(WAIT)
    return message is not None and message.payload == SETTLE


@contextlib.contextmanager
def running_sub(broker: Broker, *args: str) -> Iterator[tuple[subprocess.Popen[str], Any, Any]]:
    """``msgbroker mm2 sub ARGS``; yields once it is subscribed (its stderr says so)."""
    process = subprocess.Popen(
        [MSGBROKER, "mm2", "sub", *args, *where(broker)],
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


def printed_until_end(capsys, broker: Broker, identity: str, out: LineReader) -> list[str]:
    """Unicast ``end`` to the sub logged in as ``identity`` and wait for it: every line it
    printed before (what was sent to it earlier has all arrived)."""
    pub(capsys, broker, f"@{identity}", "end", "--id", "ender")
    out.wait_for(r"^@ender end$")
    return out.lines[:-1]


# -- pub ----------------------------------------------------------------------------------------


def test_pub_publishes_typed_properties_and_prints_nothing(capsys, broker):
    with watcher(broker, "reader-1", "news-1") as reader:
        pub(capsys, broker, "news-1", "hello world", "--property", "n=N5",
            "--property", "d=D1413198000.0", "--property", "name=THello%20there")  # fmt: skip
        message = reader.next_message(WAIT)
        assert (message.destination, message.payload) == ("news-1", b"hello world")
        assert message.properties == {"n": 5, "d": Decimal("1413198000.0"), "name": "Hello there"}
        assert nothing_more(reader)  # one message


def test_pub_to_an_identity_is_a_unicast_from_the_generated_id(capsys, broker):
    with watcher(broker, "reader-2") as reader:
        pub(capsys, broker, "@reader-2", "psst")
        message = reader.next_message(WAIT)
        assert message.payload == b"psst"
        assert re.fullmatch(r"@cli-\d+-[0-9a-f]{4}", message.destination)


def test_pub_dash_reads_lines_from_stdin(capsys, monkeypatch, broker):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\r\n\ntwo words\nthree")))
    with watcher(broker, "reader-3", "lines-3") as reader:
        pub(capsys, broker, "lines-3", "-", "--property", "k=Tv")
        received = [reader.next_message(WAIT) for _ in range(3)]
        assert [m.payload for m in received] == [b"one", b"two words", b"three"]
        assert all(m.properties == {"k": "v"} for m in received)
        assert nothing_more(reader)  # the empty line is no message


def test_pub_dash_from_a_pipe_in_a_subprocess(broker):
    with watcher(broker, "reader-4", "piped-4") as reader:
        done = subprocess.run(
            [MSGBROKER, "mm2", "pub", "piped-4", "-", *where(broker)],
            input=b"a\nb\n\nc\n", capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
        assert [reader.next_message(WAIT).payload for _ in range(3)] == [b"a", b"b", b"c"]
        assert nothing_more(reader)  # three messages, no more


def test_pub_over_tls(capsys, broker):
    with watcher(broker, "reader-5", "secure-5") as reader:
        tls = ["--tls", "--ca", broker.ca, "--port", str(broker.tls_port)]
        assert run(capsys, "mm2", "pub", "secure-5", "x", *tls) == (0, "", "")
        assert reader.next_message(WAIT).payload == b"x"
    status, out, err = run(capsys, "mm2", "pub", "t", "x", "--tls", "--port", str(broker.tls_port))
    assert (status, out) == (1, "")
    assert err.startswith(f"msgbroker: error: TLS with 127.0.0.1:{broker.tls_port} failed: ")
    assert err.count("\n") == 1


# -- usage errors and failures ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        ("n=5", "without a type prefix"),
        ("n", "is not KEY=VALUE"),
        ("Name=Tx", "is not KEY=VALUE"),
        ("d=Dsoon", "bad date value"),
        ("n=N99999999999999999999", "bad number value"),
    ],
)
def test_a_bad_property_is_a_usage_error(capsys, option, complaint):
    with pytest.raises(SystemExit) as info:
        main(["mm2", "pub", "t", "x", "--property", option])
    assert info.value.code == 2
    assert complaint in capsys.readouterr().err


def test_a_property_given_twice_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["mm2", "pub", "t", "x", "--property", "n=N1", "--property", "n=N2"])
    assert info.value.code == 2
    assert "'n' given twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("name<=THel", "operator <= does not apply to text"),
        ("n&N5", "operator & applies to text only"),
        ("user-id>=10", "without a type prefix"),
        ("just words", "bad filter"),
    ],
)
def test_a_bad_filter_is_a_usage_error(capsys, expression, complaint):
    with pytest.raises(SystemExit) as info:
        main(["mm2", "sub", "t", "--filter", expression])
    assert info.value.code == 2
    assert complaint in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["pub", "", "x"],
        ["pub", "caf\u00e9", "x"],
        ["pub", "t", "x", "--id", "@me"],
        ["sub", "t", "--ack", "--batch-ack", "2"],
        ["sub", "t", "--batch-ack", "0"],
    ],
)
def test_bad_destinations_identities_and_windows_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["mm2", *argv])
    assert info.value.code == 2
    assert "msgbroker mm2" in capsys.readouterr().err


def test_connection_refused_is_one_line_and_exit_1(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status, out, err = run(capsys, "mm2", "pub", "t", "x", "--port", str(port))
    assert (status, out) == (1, "")
    assert err == f"msgbroker: error: cannot connect to 127.0.0.1:{port}: Connection refused\n"


# -- sub ----------------------------------------------------------------------------------------


def test_sub_prints_messages_and_exits_0_on_ctrl_c(capsys, broker):
    with running_sub(broker, "news-6", "--id", "sub-6") as (process, out, err):
        pub(capsys, broker, "news-6", "hello world", "--property", "n=N5",
            "--property", "name=THi%20there")  # fmt: skip
        assert out.wait_for("hello").string == "news-6 [n=N5 name=THi%20there] hello world\n"
        pub(capsys, broker, "news-6", "caf\udce9\tx")  # b"caf\xe9\tx"
        assert out.wait_for("caf").string == "news-6 caf\\xe9\\tx\n"
        pub(capsys, broker, "news-6", "[not a property]")
        assert out.wait_for("not a").string == "news-6 \\x5bnot a property]\n"
        pub(capsys, broker, "@sub-6", "psst", "--id", "tom")
        assert out.wait_for("psst").string == "@tom psst\n"
        status = stop_process(process, signal.SIGINT)
        stderr = "".join(err.lines) + err.rest()
    assert status == 0
    assert "Traceback" not in stderr
    assert stderr.startswith(f"msgbroker: subscribed to news-6 as sub-6 on 127.0.0.1:{broker.port}")
    assert len(out.lines) == 4  # its own round trip is never printed


def test_sub_with_filters_gets_only_matching_messages(capsys, broker):
    filters = ("--filter", "user-id>=N10", "--filter", "name<THel")
    with running_sub(broker, "orders-7", *filters, "--id", "sub-7") as (_, out, _err):
        for payload, properties in [
            ("both", ("user-id=N12", "name=THello")),
            ("low", ("user-id=N5", "name=THello")),
            ("no-user-id", ("name=THello",)),
            ("other-name", ("user-id=N12", "name=TWorld")),
            ("date", ("user-id=D10.5", "name=THelp")),  # N filter, D property: numeric
            ("text-id", ("user-id=T12", "name=THello")),  # a property of the other type
            ("none", ()),
        ]:
            props = [arg for p in properties for arg in ("--property", p)]
            pub(capsys, broker, "orders-7", payload, *props)
        assert printed_until_end(capsys, broker, "sub-7", out) == [
            "orders-7 [user-id=N12 name=THello] both\n",
            "orders-7 [user-id=D10.5 name=THelp] date\n",
        ]


def test_sub_with_queue_two_members_share_the_messages(capsys, broker, monkeypatch):
    group = ("--queue", "workers")
    with (
        running_sub(broker, "jobs-8", *group, "--id", "worker-a") as (_, out_a, _a),
        running_sub(broker, "jobs-8", *group, "--id", "worker-b") as (_, out_b, _b),
        watcher(broker, "all-8", "jobs-8") as everyone,
    ):
        jobs = [f"job{i}".encode() for i in range(6)]
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n".join(jobs))))
        pub(capsys, broker, "jobs-8", "-")
        got_a = printed_until_end(capsys, broker, "worker-a", out_a)
        got_b = printed_until_end(capsys, broker, "worker-b", out_b)
        assert got_a and got_b  # both members took some
        assert sorted(got_a + got_b) == [f"jobs-8 {job.decode()}\n" for job in jobs]  # once each
        # a plain subscriber beside the group gets every message
        assert [everyone.next_message(WAIT).payload for _ in jobs] == jobs


@pytest.mark.parametrize("window", [["--ack"], ["--batch-ack", "2"]], ids=["ack", "batch-ack"])
def test_sub_with_an_ack_window_acknowledges_and_gets_everything(capsys, broker, monkeypatch,
                                                                 window):  # fmt: skip
    identity = f"sub-9-{window[0][2:]}"
    with running_sub(broker, "acked-9", *window, "--id", identity) as (_, out, _err):
        lines = [f"m{i}".encode() for i in range(7)]  # more than the window holds
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n".join(lines))))
        pub(capsys, broker, "acked-9", "-")
        assert printed_until_end(capsys, broker, identity, out) == [
            f"acked-9 {line.decode()}\n" for line in lines
        ]


def test_sub_whose_identity_logs_in_elsewhere_reconnects_and_takes_it_back(capsys, broker):
    # the broker closes the older connection without an ERROR frame, as when it stops: sub
    # cannot tell the two apart, and reconnects (docs/clientkit.md, "Reconnecting")
    with running_sub(broker, "t-10", "--id", "sub-10") as (process, out, err):
        with BlockingMM2Client("127.0.0.1", broker.port, "sub-10", timeout=WAIT) as other:
            where = f"127.0.0.1:{broker.port}"
            assert err.wait_for("lost").string == (
                f"msgbroker: lost the connection to {where} (the server closed the "
                "connection); reconnecting\n"
            )
            assert err.wait_for("reconnected").string == (
                f"msgbroker: reconnected to {where}; subscribed to t-10 again\n"
            )
            with pytest.raises(MM2ConnectionClosed):
                other.next_message(WAIT)  # the newer login, the sub's, closed it
        pub(capsys, broker, "t-10", "still here")
        assert out.wait_for("still").string == "t-10 still here\n"
        assert process.poll() is None


# -- units --------------------------------------------------------------------------------------


def test_extensions_asked_for():
    parser = build_parser()

    def asked(*argv: str) -> tuple[Any, Any]:
        return extensions(parser.parse_args(["mm2", *argv]))

    assert asked("sub", "t") == (("pubsub",), ("batch-ack",))  # batch-ack if offered
    assert asked("sub", "t", "--ack") == (("pubsub", "ack"), ())
    assert asked("sub", "t", "--batch-ack", "50") == (("pubsub", "batch-ack:max-count=50"), ())
    assert parser.parse_args(["mm2", "pub", "t", "x"]).port == 4447


def test_rendering():
    def line(destination: str, payload: bytes, **properties: Any) -> str:
        return render_message(Message(1, destination, payload, properties))

    assert line("t", b"x y") == "t x y"
    assert line("t", b"a\nb\xff") == "t a\\nb\\xff"
    assert line("t", b"[x]") == "t \\x5bx]"  # not to be read as properties
    assert line("t", b"[x]", n=1) == "t [n=N1] [x]"
    assert line("@al", b"", d=Decimal("1.50"), s="a b]") == "@al [d=D1.50 s=Ta%20b%5D] "


def test_mm2_is_registered_beside_the_others(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("ssmp", "stmp", "mm2"))
