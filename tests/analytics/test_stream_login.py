"""``msgbroker analytics stream`` logs in as every client can: ``--id``, ``--scheme``,
``--secret-file``, TLS with ``--tls``, ``--ca``, ``--cert``, ``--key`` — against a real broker
that takes only the ``secret`` and ``cert`` schemes, over real TLS. The sink and the command's
checks need no Spark; one test runs the query through Spark, to show the login travels in
the sink's options (paths only: the files are read by the driver)."""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from msgbroker.analytics.datasource import (
    BrokerLogin,
    MsgbrokerStreamWriter,
    PublishRows,
    SinkError,
)
from msgbroker.analytics.stream import add_stream_arguments, broker_login
from msgbroker.cli import main
from msgbroker.plugins.ssmp.client import BlockingSSMPClient, Delivery
from tests.certs import PKI, Issued, make_pki
from tests.ssmp.e2e_support import WAIT, RunningBroker, parse_address, running_broker

SECRET = b"stats-s3cret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: Any) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stats_cert(pki: PKI) -> Issued:
    return pki.client("stats", filename="stats")


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.fixture(scope="module")
def broker(pki: PKI, secret_file: Path) -> Iterator[RunningBroker]:
    """TLS only, and no ``open`` login: ``secret`` or ``cert``."""
    with running_broker(
        ("ssmp=tls:0:interface=127.0.0.1",),
        auth=("secret", "cert"), secret_file=str(secret_file),
        tls_cert=str(pki.server.cert), tls_key=str(pki.server.key), tls_ca=str(pki.ca.cert_path),
    ) as running:  # fmt: skip
        yield running


def address(broker: RunningBroker) -> str:
    host, port = parse_address(broker.service.broker.listening[0][1])
    return f"{host}:{port}"


def watcher(broker: RunningBroker, pki: PKI, topic: str) -> BlockingSSMPClient:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    client = BlockingSSMPClient(
        broker.host, broker.port, "watcher", "secret", SECRET, ssl_context=context, timeout=WAIT
    )
    client.subscribe(topic)
    return client


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_stream_arguments(parser)
    return parser.parse_args(["journal", *argv])


def test_the_command_takes_the_clients_login_options(pki, stats_cert, secret_file):
    args = parse("--id", "stats", "--secret-file", str(secret_file), "--tls",
                 "--ca", str(pki.ca.cert_path), "--cert", str(stats_cert.cert),
                 "--key", str(stats_cert.key))  # fmt: skip
    login = broker_login(args)
    assert login == BrokerLogin(
        "stats", None, str(secret_file), True, str(pki.ca.cert_path), str(stats_cert.cert),
        str(stats_cert.key),
    )  # fmt: skip
    assert login.login_scheme == "secret" and login.uses_tls
    assert BrokerLogin.from_options(login.options()) == login
    assert str(SECRET) not in str(login.options())  # paths travel, never the secret
    # as the protocol clients: the cert scheme with --cert, its CN in front of the name
    cert_only = broker_login(parse("--cert", str(stats_cert.cert), "--key", str(stats_cert.key)))
    assert (cert_only.login_scheme, cert_only.identity) == ("cert", "stats/spark-stats")
    assert broker_login(parse("--identity", "old")).identity == "old"  # the old spelling
    assert broker_login(parse()) == BrokerLogin()


@pytest.mark.parametrize("scheme", ["secret", "cert"])
def test_the_sink_publishes_over_tls_logged_in_with_a_secret_or_its_certificate(
    broker, pki, stats_cert, secret_file, tmp_path, scheme
):
    login = BrokerLogin(
        "stats" if scheme == "secret" else "stats/spark-stats",
        secret_file=str(secret_file) if scheme == "secret" else None,
        ca=str(pki.ca.cert_path), cert=str(stats_cert.cert), key=str(stats_cert.key),
    )  # fmt: skip
    assert login.login_scheme == scheme
    writer = MsgbrokerStreamWriter(
        {"broker": address(broker), "state": str(tmp_path / "state"), **login.options()}
    )
    with watcher(broker, pki, "_stats/topic/t") as watching:
        assert writer.publish([PublishRows([("_stats/topic/t", b'{"n": 1}')])], 0) == 1
        event = watching.next_event(WAIT)
    assert event == Delivery(login.identity, "MCAST", "_stats/topic/t", b'{"n": 1}')


def test_a_refused_login_is_one_line_before_spark_starts(broker, pki, tmp_path, capsys):
    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"guess")
    journal = tmp_path / "journal"
    journal.mkdir()
    status = main(["analytics", "stream", str(journal), "--broker", address(broker),
                   "--ca", str(pki.ca.cert_path), "--id", "stats",
                   "--secret-file", str(wrong)])  # fmt: skip
    assert status == 1
    assert capsys.readouterr().err == (
        f"msgbroker: error: {address(broker)} refused the login as 'stats' with scheme "
        "'secret': 401 unauthorized: secret cert\n"
    )


def test_plain_tcp_to_a_tls_listener_and_a_missing_secret_file_are_one_line(
    broker, tmp_path, capsys
):
    journal = tmp_path / "journal"
    journal.mkdir()
    base = ["analytics", "stream", str(journal), "--broker", address(broker)]
    assert main([*base, "--scheme", "secret"]) == 1
    assert capsys.readouterr().err == (
        "msgbroker: error: the secret scheme needs a secret file (--secret-file)\n"
    )
    assert main([*base, "--secret-file", str(tmp_path / "nope")]) == 1
    assert capsys.readouterr().err.startswith(
        f"msgbroker: error: cannot read secret file {tmp_path / 'nope'}: "
    )
    with pytest.raises(SinkError, match="not a valid SSMP id"):
        MsgbrokerStreamWriter({"state": str(tmp_path / "s"), "identity": "no spaces"})


@pytest.mark.spark
def test_the_stats_query_logs_in_through_spark_with_tls_and_a_secret(
    spark, broker, pki, stats_cert, secret_file, tmp_path
):
    from msgbroker.analytics.stream import run_stream
    from tests.analytics.test_stream import append_segment, journal_rows

    journal = tmp_path / "journal"
    (journal / "messages").mkdir(parents=True)
    login = BrokerLogin("stats", "secret", str(secret_file), True, str(pki.ca.cert_path),
                        str(stats_cert.cert), str(stats_cert.key))  # fmt: skip
    query = run_stream(
        spark, journal, address(broker), checkpoint=tmp_path / "checkpoint",
        trigger={"processingTime": "100 milliseconds"}, login=login,
    )  # fmt: skip
    try:
        with watcher(broker, pki, "_stats/topic/a") as watching:
            append_segment(journal, 1, journal_rows((1, "mcast", "a"), (2, "mcast", "a")))
            query.processAllAvailable()
            append_segment(journal, 2, journal_rows((12, "mcast", "a")))
            query.processAllAvailable()  # the watermark (10 s) closes the first window
            event = watching.next_event(WAIT)
    finally:
        query.stop()
    assert query.exception() is None
    assert event is not None and event.sender == "stats" and event.to == "_stats/topic/a"
    assert b'"messages":2' in event.payload
