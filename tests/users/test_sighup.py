"""SIGHUP on a real ``twistd msgbroker``: the configuration file read again (the command
line still over it), the users file, the TLS certificate and key (new connections get the
new certificate, open ones stay), the log level; a bad new file refused in one log line,
the old settings kept; never a connection dropped. And the TLS swap in-process, on a
broker in the tests' reactor thread."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509

from msgbroker import ConfigError
from msgbroker.plugins.users.passwords import hash_password
from tests.certs import issue, make_pki
from tests.ssmp.e2e_support import WAIT, parse_address, running_broker
from tests.test_signals_and_logs import Log
from tests.test_twistd import recv_until, twistd

MSGBROKER = str(Path(sys.executable).with_name("msgbroker"))


def ask(sock, request: bytes, answer: bytes) -> None:
    sock.sendall(request)
    assert recv_until(sock, answer) == answer


def login(address, identity: bytes, password: bytes, context=None) -> tuple[socket.socket, bytes]:
    """A connection and the answer to its LOGIN."""
    sock = socket.create_connection(address, timeout=WAIT)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="localhost")
    sock.sendall(b"LOGIN %s password %s\n" % (identity, password))
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = sock.recv(1024)
        if not chunk:
            break
        answer += chunk
    return sock, answer


def not_debug(lines: list[str]) -> list[str]:
    """The lines but the debug ones (the level is debug meanwhile; they are not ours)."""
    return [line for line in lines if "#debug]" not in line]


def serial(sock: ssl.SSLSocket) -> int:
    return x509.load_der_x509_certificate(sock.getpeercert(binary_form=True)).serial_number


def client_context(pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    return context


def write_config(path: Path, users: Path, pki, log_level: str) -> None:
    path.write_text(
        'listen = ["ssmp=tcp:0:interface=127.0.0.1", "ssmp=tls:0:interface=127.0.0.1"]\n'
        f'tls-cert = "{pki.server.cert}"\ntls-key = "{pki.server.key}"\n'
        f'log-level = "{log_level}"\nlogin-failure-delay = 5\n'
        f'[auth]\nschemes = ["password"]\nusers = "{users}"\n'
    )


def test_sighup_reloads_users_tls_and_log_level_and_refuses_bad_files(tmp_path):
    pki = make_pki(tmp_path / "pki")
    users = tmp_path / "users"
    users.write_text(
        f"alice:{hash_password(b's3cret')}\ncarol:{hash_password(b'c')}\n"
        f"dave:{hash_password(b'd')}\n"
    )
    config = tmp_path / "msgbroker.toml"
    write_config(config, users, pki, "info")
    # the command line overrides the file, before and after a reload
    proc = twistd("--config", str(config), "--login-failure-delay", "0.05")
    try:
        log = Log(proc)
        listening = log.until(r"ssmp listening on")
        if not any("listening on" in line for line in log.lines):  # the other, not read yet
            listening += log.until(r"ssmp listening on")
        listening += log.lines  # what came with it (Log.until looks at new lines only)
        log.lines.clear()
        where = dict(line.split()[-1].split(":", 1) for line in listening if "listening on" in line)
        plain, tls = parse_address("tcp:" + where["tcp"]), parse_address("tls:" + where["tls"])
        context = client_context(pki)
        carol, answer = login(plain, b"carol", b"c")
        assert answer == b"200\n"
        ask(carol, b"SUBSCRIBE news\n", b"200\n")
        old_tls, answer = login(tls, b"dave", b"d", context)
        assert answer == b"200\n"
        first_serial = serial(old_tls)

        # new password for alice, a new server certificate, debug lines
        subprocess.run([MSGBROKER, "users", "add", str(users), "alice"], input=b"n3w\n", check=True)
        issue(
            pki.ca,
            pki.directory,
            "server",
            "localhost",
            dns=("localhost",),
            ips=("127.0.0.1",),
            server=True,
        )
        write_config(config, users, pki, "debug")
        proc.send_signal(signal.SIGHUP)
        assert "reloaded the configuration from" in log.until(r"SIGHUP: ")[-1]

        started = time.monotonic()
        _, answer = login(plain, b"alice", b"s3cret")
        assert answer == b"401 password\n"
        assert time.monotonic() - started < 4  # the command line's delay, not the file's 5 s
        new_tls, answer = login(tls, b"alice", b"n3w", context)
        assert answer == b"200\n"
        assert serial(new_tls) != first_serial  # the new certificate for a new connection
        ask(carol, b"PING\n", b"000 . PONG\n")  # open connections stay
        ask(old_tls, b"PING\n", b"000 . PONG\n")  # on their certificate
        ask(new_tls, b"MCAST news after\n", b"200\n")
        assert recv_until(carol, b"000 alice MCAST news after\n").endswith(b"after\n")
        bad = socket.create_connection(plain, timeout=WAIT)
        bad.sendall(b"NOT A LOGIN\n")
        assert "first request is not LOGIN" in log.until(r"#debug\] ssmp .*400")[-1]
        bad.close()

        # a bad users file, then a bad certificate: refused in one line each, nothing changes
        good_users = users.read_text()
        users.write_text("alice:not-a-hash\n")
        proc.send_signal(signal.SIGHUP)
        refused = not_debug(log.until(r"SIGHUP: "))
        assert len(refused) == 1 and "reload refused" in refused[0]
        assert "line 1: the hash of 'alice' is not an argon2 hash" in refused[0]
        users.write_text(good_users)
        pki.server.cert.write_text("not a certificate\n")
        proc.send_signal(signal.SIGHUP)
        refused = not_debug(log.until(r"SIGHUP: "))
        assert len(refused) == 1 and "reload refused" in refused[0]
        assert "no PEM certificate" in refused[0]
        proc.send_signal(signal.SIGUSR1)
        assert len(not_debug(log.until(r"status: "))) == 1  # no traceback after the refusal
        again, answer = login(tls, b"carol2", b"x", context)
        assert answer == b"401 password\n"
        assert serial(again) == serial(new_tls)  # still the certificate that was good
        ask(carol, b"PING\n", b"000 . PONG\n")
        ask(old_tls, b"PING\n", b"000 . PONG\n")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        proc.stdout.close()


def test_reload_swaps_the_tls_certificate_for_new_connections_only(tmp_path):
    pki = make_pki(tmp_path)
    config = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key), "auth": ("open",)}
    with running_broker(("ssmp=tls:0:interface=127.0.0.1",), **config) as broker:
        context = client_context(pki)
        address = (broker.host, broker.port)
        old = context.wrap_socket(
            socket.create_connection(address, timeout=WAIT), server_hostname="localhost"
        )
        ask(old, b"LOGIN old open\n", b"200\n")
        before = serial(old)
        renewed = issue(pki.ca, tmp_path, "renewed", "localhost", dns=("localhost",), server=True)
        running = broker.service.broker.config
        from attrs import evolve

        broker.call(
            broker.service.broker.reload,
            evolve(running, tls_cert=str(renewed.cert), tls_key=str(renewed.key)),
        )
        new = context.wrap_socket(
            socket.create_connection(address, timeout=WAIT), server_hostname="localhost"
        )
        ask(new, b"LOGIN new open\n", b"200\n")
        assert serial(new) != before
        ask(old, b"PING\n", b"000 . PONG\n")  # the connection made before goes on
        # a key that does not match its certificate is refused, and the context stays
        mismatched = evolve(running, tls_cert=str(renewed.cert), tls_key=str(pki.server.key))
        with pytest.raises(ConfigError, match="TLS"):
            broker.call(broker.service.broker.reload, mismatched)
        third = context.wrap_socket(
            socket.create_connection(address, timeout=WAIT), server_hostname="localhost"
        )
        assert serial(third) == serial(new)
        for sock in (old, new, third):
            sock.close()
