"""Test certificates, generated on the fly with ``cryptography`` (EC P-256, fast).

``make_pki(directory)`` writes a CA, a server certificate for 127.0.0.1 / ::1 / localhost,
and a second, untrusted CA; ``pki.client(...)`` issues client certificates with a given
Common Name and DNS / email Subject Alternative Names, from either CA::

    pki = make_pki(tmp_path)
    alice = pki.client("alice", dns=("alice.example",), emails=("alice@example.org",))
    rogue = pki.client("alice", issuer=pki.untrusted)
    BrokerConfig(..., tls_cert=str(pki.server.cert), tls_key=str(pki.server.key),
                 tls_ca=str(pki.ca.cert_path))
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_ONE_DAY = datetime.timedelta(days=1)


@frozen
class Issued:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@frozen(eq=False)
class Authority:
    """A certificate authority: its key (in memory) and its certificate (in memory and on disk)."""

    name: str
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    cert_path: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_authority(directory: Path, name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _ONE_DAY)
        .not_valid_after(now + 30 * _ONE_DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / f"{name}.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(name, key, cert, cert_path)


def issue(
    authority: Authority,
    directory: Path,
    filename: str,
    common_name: str | None,
    *,
    dns: Sequence[str] = (),
    emails: Sequence[str] = (),
    ips: Sequence[str] = (),
    server: bool = False,
) -> Issued:
    """A leaf certificate signed by ``authority``, written as ``filename.pem``/``.key``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = _name(common_name) if common_name is not None else x509.Name([])
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _ONE_DAY)
        .not_valid_after(now + 30 * _ONE_DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
            critical=False,
        )
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    alt_names += [x509.RFC822Name(address) for address in emails]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if alt_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(alt_names), critical=common_name is None
        )
    cert = builder.sign(authority.key, hashes.SHA256())
    issued = Issued(directory / f"{filename}.pem", directory / f"{filename}.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, issued.key)
    return issued


@frozen(eq=False)
class PKI:
    """A trusted CA with a server certificate, and an untrusted CA, in ``directory``."""

    directory: Path
    ca: Authority
    untrusted: Authority
    server: Issued

    def client(
        self,
        common_name: str | None,
        *,
        dns: Sequence[str] = (),
        emails: Sequence[str] = (),
        issuer: Authority | None = None,
        filename: str | None = None,
    ) -> Issued:
        """A client certificate (default issuer: the trusted CA)."""
        issuer = issuer or self.ca
        name = filename or f"client-{common_name or 'nocn'}-{issuer.name}"
        return issue(issuer, self.directory, name, common_name, dns=dns, emails=emails)


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_authority(directory, "test-ca")
    untrusted = make_authority(directory, "untrusted-ca")
    server = issue(
        ca, directory, "server", "localhost",
        dns=("localhost",), ips=("127.0.0.1", "::1"), server=True,
    )
    return PKI(directory, ca, untrusted, server)
