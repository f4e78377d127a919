"""The engine server fixtures themselves: real redis-server and nats-server processes that
start on a free port, restart on the same one, die on SIGKILL, hang on SIGSTOP, and refuse
clients without the password or without TLS when asked to."""

from __future__ import annotations

import json
import os
import socket
import ssl

import pytest

from tests.certs import make_pki
from tests.cluster.servers import (
    NatsServer,
    RedisError,
    RedisServer,
    RespReader,
    ServerFailed,
    encode_command,
)

#: how long a paused server is given to (wrongly) answer
SILENCE = 0.3


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def refused(server: RedisServer | NatsServer) -> bool:
    try:
        socket.create_connection((server.host, server.port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# -- Redis


def test_redis_fixture_serves_on_loopback_without_persistence(redis_server):
    assert redis_server.command("SET", "k", "v") == "OK"
    assert redis_server.command("GET", "k") == b"v"
    assert redis_server.command("CONFIG", "GET", "bind") == [b"bind", b"127.0.0.1"]
    assert redis_server.command("CONFIG", "GET", "save") == [b"save", b""]
    assert redis_server.command("CONFIG", "GET", "appendonly") == [b"appendonly", b"no"]
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}"
    redis_server.stop()
    assert not redis_server.running
    assert sorted(p.name for p in redis_server.directory.iterdir()) == ["redis.log"]


def test_redis_restart_keeps_the_port_and_loses_data_unless_durable(tmp_path):
    with RedisServer(tmp_path / "plain") as plain:
        port, pid = plain.port, plain.pid
        plain.command("SET", "k", "v")
        plain.restart()
        assert (plain.port, plain.command("GET", "k")) == (port, None)
        assert plain.pid != pid and not alive(pid)
    with RedisServer(tmp_path / "durable", durable=True) as durable:
        durable.command("SET", "k", "kept")
        durable.command("XADD", "stream", "*", "f", "1")
        durable.restart()
        assert durable.command("GET", "k") == b"kept"
        assert durable.command("XLEN", "stream") == 1


def test_redis_kill_is_sigkill_and_a_start_comes_back_on_the_port(redis_server):
    pid, port = redis_server.pid, redis_server.port
    redis_server.kill()
    assert redis_server.process.returncode == -9
    assert not alive(pid) and refused(redis_server)
    redis_server.start()
    assert redis_server.port == port
    assert redis_server.command("PING") == "PONG"


def test_a_paused_redis_answers_only_once_resumed(redis_server):
    with redis_server.connect() as sock:
        redis_server.pause()
        sock.settimeout(SILENCE)
        sock.sendall(encode_command("PING"))
        with pytest.raises(TimeoutError):
            sock.recv(16)
        redis_server.resume()
        sock.settimeout(15)
        assert RespReader(sock).read() == "PONG"
    redis_server.pause()
    redis_server.stop()  # SIGTERM reaches a stopped process once it is continued
    assert redis_server.process.returncode == 0


def test_redis_password_is_required(tmp_path):
    with RedisServer(tmp_path / "r", password="s3cret") as redis:
        assert redis.command("PING") == "PONG"  # the fixture's own client logs in
        with redis.connect() as sock:
            sock.sendall(encode_command("GET", "k"))
            with pytest.raises(RedisError, match="NOAUTH"):
                RespReader(sock).read()
        with pytest.raises(RedisError, match="WRONGPASS"):
            redis.command("PING", password="guess")
        assert "s3cret" not in redis.url


def test_redis_tls_serves_tls_only(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with RedisServer(tmp_path / "r", pki=pki, password="pw") as redis:
        assert redis.url == f"rediss://127.0.0.1:{redis.port}"
        assert redis.command("SET", "k", "v") == "OK"
        with redis.connect() as sock:
            assert isinstance(sock, ssl.SSLSocket)
        # a client speaking plain RESP to the TLS port gets no reply, only a close
        with socket.create_connection((redis.host, redis.port), timeout=15) as plain:
            plain.sendall(encode_command("PING"))
            try:
                answer = plain.recv(64)
            except ConnectionResetError:
                answer = b""
            assert answer == b""
        # and one that does not trust the test CA fails its handshake
        with socket.create_connection((redis.host, redis.port), timeout=15) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")


def test_a_redis_that_cannot_start_says_why(tmp_path):
    broken = RedisServer(tmp_path / "r", extra=("--no-such-option", "1"))
    with pytest.raises(ServerFailed, match="no-such-option"):
        broken.start()
    assert not broken.running


# -- NATS


def nats_info(server: NatsServer, sock: socket.socket) -> dict[str, object]:
    line = server.info(sock)
    assert line is not None
    return json.loads(line[len(b"INFO "):])


def test_nats_fixture_delivers_a_message_and_has_no_jetstream(nats_server):
    with nats_server.connect() as sock:
        stream = sock.makefile("rb")
        info = json.loads(stream.readline()[len(b"INFO "):])
        assert info["port"] == nats_server.port
        assert not info.get("jetstream")
        sock.sendall(b'CONNECT {"verbose":false}\r\nSUB t 1\r\nPUB t 5\r\nhello\r\nPING\r\n')
        assert stream.readline() == b"MSG t 1 5\r\n"
        assert stream.readline() == b"hello\r\n"
        assert stream.readline() == b"PONG\r\n"
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"


def test_nats_restart_keeps_the_port_kill_is_sigkill_jetstream_on_request(tmp_path):
    with NatsServer(tmp_path / "n", jetstream=True) as nats:
        port, pid = nats.port, nats.pid
        with nats.connect() as sock:
            assert nats_info(nats, sock)["jetstream"] is True
        nats.restart()
        assert nats.port == port and not alive(pid)
        nats.kill()
        assert nats.process.returncode == -9 and refused(nats)
        nats.start()
        assert nats.port == port


def test_nats_user_and_password_are_required(tmp_path):
    with NatsServer(tmp_path / "n", user="node", password="pw") as nats:
        with nats.connect() as sock:
            stream = sock.makefile("rb")
            assert json.loads(stream.readline()[5:])["auth_required"] is True
            sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
            assert stream.readline().startswith(b"-ERR 'Authorization Violation'")
        with nats.connect() as sock:
            stream = sock.makefile("rb")
            stream.readline()
            sock.sendall(b'CONNECT {"verbose":false,"user":"node","pass":"pw"}\r\nPING\r\n')
            assert stream.readline() == b"PONG\r\n"


def test_nats_tls_upgrades_after_info(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with NatsServer(tmp_path / "n", pki=pki) as nats:
        assert nats.url == f"tls://127.0.0.1:{nats.port}"
        with nats.connect() as sock:
            assert nats_info(nats, sock)["tls_required"] is True
            context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
            with context.wrap_socket(sock, server_hostname="localhost") as tls:
                tls.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
                assert tls.makefile("rb").readline() == b"PONG\r\n"


def test_a_paused_nats_answers_only_once_resumed(nats_server):
    with nats_server.connect() as sock:
        stream = sock.makefile("rb")
        stream.readline()
        nats_server.pause()
        sock.settimeout(SILENCE)
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        with pytest.raises(TimeoutError):
            sock.recv(16)
        nats_server.resume()
        sock.settimeout(15)
        assert stream.readline() == b"PONG\r\n"


def test_redis_until_looks_again_after_each_named_command_within_a_deadline(redis_server):
    looks: list[bytes | None] = []

    def check() -> bool:
        value = redis_server.command("GET", "k")
        looks.append(value)
        if value is None:
            redis_server.command("SET", "k", "v")  # once MONITOR runs: it wakes the wait
        return value == b"v"

    redis_server.until(check, "k to be set", after=("SET",))
    assert looks == [None, b"v"]  # once at the start, once after the SET, never polled
    with pytest.raises(TimeoutError, match="something that never comes"):
        redis_server.until(lambda: False, "something that never comes", after=("SET",),
                           timeout=SILENCE)


def test_redis_until_gone_wakes_on_expiry_and_deletion(redis_server):
    redis_server.command("SET", "short", "lived", "PX", "100")
    redis_server.until_gone("short", "the key to expire")
    assert redis_server.command("EXISTS", "short") == 0
    redis_server.until_gone("never-was", "a key that does not exist")  # at once
    redis_server.command("SET", "kept", "v")
    with pytest.raises(TimeoutError, match="a key nobody deletes"):
        redis_server.until_gone("kept", "a key nobody deletes", timeout=SILENCE)


def test_redis_asking_for_client_certificates_gets_the_fixtures_own(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with RedisServer(tmp_path / "r", pki=pki, client_certificates=True) as redis:
        assert redis.command("PING") == "PONG"  # the fixture presents its certificate
        context = ssl.create_default_context(cafile=str(pki.ca.cert_path))

        def ping_without_a_certificate() -> None:
            with socket.create_connection((redis.host, redis.port), timeout=15) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as anonymous:
                anonymous.sendall(encode_command("PING"))
                if not anonymous.recv(64):
                    raise ConnectionError("closed without a reply")

        with pytest.raises((ssl.SSLError, ConnectionError)):  # at the handshake or after
            ping_without_a_certificate()


def test_a_server_is_ready_when_its_output_says_so(tmp_path):
    with RedisServer(tmp_path / "r") as redis:
        assert "Ready to accept connections" in redis.log_text()
    with NatsServer(tmp_path / "n") as nats:
        assert "Server is ready" in nats.log_text()
