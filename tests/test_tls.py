"""TLS listeners end to end: real handshakes with certificates generated here.

One broker listens with TLS (and, for contrast, on plain TCP), with ``open`` and ``secret``
enabled; ``cert`` is added automatically because a TLS listener exists. Clients use
Python's ``ssl`` module, so the TLS version each side offers is under the test's control.
"""

from __future__ import annotations

import socket
import ssl
import warnings

import pytest

from msgbroker.cli import main
from msgbroker.plugins.ssmp.client import (
    BlockingSSMPClient,
    Delivery,
    SSMPError,
    client_tls_options,
    connect,
)
from tests.certs import make_pki
from tests.ssmp.e2e_support import WAIT, Inbox, parse_address, running_broker

SECRET = b"s3cret-for-tls"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def alice_cert(pki):
    return pki.client(
        "alice", dns=("alice.example.com",), emails=("alice@example.org",), filename="alice"
    )


@pytest.fixture(scope="module")
def broker(pki, tmp_path_factory):
    secret_file = tmp_path_factory.mktemp("secret") / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    with running_broker(
        ("ssmp=tls:0:interface=127.0.0.1", "ssmp=tcp:0:interface=127.0.0.1"),
        auth=("open", "secret"),
        secret_file=str(secret_file),
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_ca=str(pki.ca.cert_path),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def plain_port(broker):
    """The broker's plain-TCP SSMP port."""
    return parse_address(broker.service.broker.listening[1][1])[1]


def context(pki, cert=None, version=None):
    """A client context trusting the test CA, optionally with a client certificate, optionally
    pinned to one TLS version."""
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def exchange(broker, ctx, request: bytes) -> bytes:
    """Send ``request`` over TLS and read until the broker closes the connection (fails if it
    does not close within WAIT seconds)."""
    with socket.create_connection((broker.host, broker.port), timeout=WAIT) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(request)
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
        return received


def login(broker, ctx, identity, scheme="cert", credential=None):
    return BlockingSSMPClient(
        broker.host, broker.port, identity, scheme, credential, ssl_context=ctx
    )


# -- protocol versions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "name"),
    [(ssl.TLSVersion.TLSv1_2, "TLSv1.2"), (ssl.TLSVersion.TLSv1_3, "TLSv1.3")],
)
def test_tls_1_2_and_1_3_are_accepted(broker, pki, version, name):
    with login(broker, context(pki, version=version), f"v-{name}", "open") as client:
        assert client.socket.version() == name
        client.ping()


def test_a_client_capped_at_tls_1_1_fails_the_handshake(broker, pki):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 on purpose
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(str(pki.ca.cert_path))
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client really offer TLS 1.0/1.1
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError) as failed:
        exchange(broker, ctx, b"LOGIN old open\n")
    # the broker refused the version (an alert from the server, not a local refusal)
    assert failed.value.reason == "TLSV1_ALERT_PROTOCOL_VERSION"


# -- the cert scheme -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "identity",
    [
        "alice",  # Common Name
        "alice.example.com",  # DNS SAN
        "alice@example.org",  # email SAN
        "alice/laptop",  # CN/suffix
        "alice.example.com/2",  # SAN/suffix
        "alice@example.org/a/b",  # the suffix may itself contain '/'
    ],
)
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_cert_login_succeeds_for_the_names_the_certificate_proves(
    broker, pki, alice_cert, identity, version
):
    with login(broker, context(pki, alice_cert, version), identity) as client:
        client.ping()


def test_cert_login_identity_receives_messages(broker, pki, alice_cert):
    ctx = context(pki, alice_cert)
    with login(broker, ctx, "alice/inbox") as alice, \
            login(broker, context(pki), "bob", "open") as bob:
        bob.ucast("alice/inbox", b"over tls")
        event = alice.next_event(timeout=WAIT)
    assert event == Delivery("bob", "UCAST", "alice/inbox", b"over tls")


@pytest.mark.parametrize(
    "identity",
    ["bob", "alic", "alice/", "bob/alice", "alice.example.com.evil", "example.com", "Alice"],
)
def test_cert_login_fails_for_other_identities_with_401_then_close(
    broker, pki, alice_cert, identity
):
    received = exchange(broker, context(pki, alice_cert), b"LOGIN %s cert\n" % identity.encode())
    assert received == b"401 open secret cert\n"


def test_cert_login_without_a_client_certificate_is_401_then_close(broker, pki):
    assert exchange(broker, context(pki), b"LOGIN alice cert\n") == b"401 open secret cert\n"


def test_cert_login_over_plain_tcp_is_401(broker, plain_port):
    with pytest.raises(SSMPError) as refused:
        BlockingSSMPClient(broker.host, plain_port, "alice", "cert")
    assert refused.value.code == 401


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_client_certificate_from_an_untrusted_ca_fails_the_handshake(broker, pki, version):
    rogue = pki.client("alice", issuer=pki.untrusted, filename="rogue-alice")
    with pytest.raises(ssl.SSLError) as failed:
        # TLS 1.2 fails in the handshake; with TLS 1.3 the client finishes its side first
        # and reads the server's alert instead of any reply
        exchange(broker, context(pki, rogue, version), b"LOGIN alice cert\n")
    assert failed.value.reason == "TLSV1_ALERT_UNKNOWN_CA"


# -- other schemes on the TLS listener -----------------------------------------------------------


def test_secret_login_works_over_tls_without_a_client_certificate(broker, pki):
    with login(broker, context(pki), "sam", "secret", SECRET) as client:
        client.ping()


def test_wrong_secret_over_tls_is_401_then_close(broker, pki):
    received = exchange(broker, context(pki), b"LOGIN sam secret wrong\n")
    assert received == b"401 open secret cert\n"


def test_open_login_works_over_tls_without_a_client_certificate(broker, pki):
    with login(broker, context(pki), "olive", "open") as client:
        client.ping()


def test_close_request_over_tls_is_200_then_close(broker, pki):
    assert exchange(broker, context(pki), b"LOGIN closer open\nCLOSE\n") == b"200\n200\n"


def test_grammar_error_over_tls_is_400_then_close(broker, pki):
    assert exchange(broker, context(pki), b"LOGIN bad open\nSUBSCRIBE t NOPE\n") == b"200\n400\n"


def test_cert_is_offered_automatically_on_a_tls_listener(pki):
    with running_broker(
        ("ssmp=tls:0:interface=127.0.0.1",),
        auth=("open",),
        tls_cert=str(pki.server.cert),
        tls_key=str(pki.server.key),
        tls_ca=str(pki.ca.cert_path),
    ) as broker:
        assert exchange(broker, context(pki), b"LOGIN x nope\n") == b"401 open cert\n"


# -- the library's TLS paths ---------------------------------------------------------------------


def test_twisted_client_logs_in_with_a_client_certificate(broker, pki, alice_cert):
    inbox = Inbox()
    tls = client_tls_options(
        "127.0.0.1", ca=str(pki.ca.cert_path), cert=str(alice_cert.cert), key=str(alice_cert.key)
    )
    proto = broker.call(
        connect, broker.reactor, broker.host, broker.port,
        identity="alice/twisted", scheme="cert", tls=tls, on_message=inbox,
    )
    broker.call(proto.subscribe, "tls-news")
    with login(broker, context(pki), "pub", "open") as publisher:
        publisher.mcast("tls-news", b"hello")
    assert broker.call(inbox.get) == Delivery("pub", "MCAST", "tls-news", b"hello")
    broker.call(proto.close)


def test_cli_pub_with_a_client_certificate_and_a_generated_id(broker, pki, alice_cert):
    with login(broker, context(pki, alice_cert), "alice/reader") as reader:
        reader.subscribe("cli-tls")
        status = main([
            "ssmp", "pub", "cli-tls", "via cli", "--port", str(broker.port),
            "--ca", str(pki.ca.cert_path), "--cert", str(alice_cert.cert),
            "--key", str(alice_cert.key),
        ])
        assert status == 0
        event = reader.next_event(timeout=WAIT)
    assert event.payload == b"via cli"
    assert event.sender.startswith("alice/cli-")  # the default id under the cert scheme
