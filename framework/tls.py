"""TLS: the server context for TLS listeners (replaceable while running: SIGHUP reloads
the certificate and key) and the identity a client certificate proves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from zope.interface import implementer

from .errors import ConfigError


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None


def _split_pem(data: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    parts = []
    for chunk in data.split(marker)[:-1]:
        parts.append(chunk + marker + b"\n")
    return parts


def server_context_factory(cert: str, key: str, ca: str | None) -> ssl.CertificateOptions:
    """A TLS server context: TLS 1.2 minimum; client certificates verified when ``ca`` is set.

    A client certificate is requested but not required, so password and open logins keep
    working on a TLS listener; a certificate that is presented must chain to ``ca``.
    """
    cert_pem = _read(cert, "TLS certificate")
    key_pem = _read(key, "TLS key")
    certs = _split_pem(cert_pem)
    if not certs:
        raise ConfigError(f"no PEM certificate in {cert}")
    try:
        leaf = ssl.Certificate.loadPEM(certs[0])
        chain = [ssl.Certificate.loadPEM(c).original for c in certs[1:]]
        private = ssl.KeyPair.load(key_pem, crypto.FILETYPE_PEM)
    except Exception as e:
        raise ConfigError(f"bad TLS certificate or key ({cert}, {key}): {e}") from None
    kwargs: dict[str, Any] = {}
    if ca is not None:
        ca_certs = _split_pem(_read(ca, "TLS CA file"))
        if not ca_certs:
            raise ConfigError(f"no PEM certificate in {ca}")
        try:
            kwargs["caCerts"] = [ssl.Certificate.loadPEM(c).original for c in ca_certs]
        except Exception as e:
            raise ConfigError(f"bad TLS CA file {ca}: {e}") from None
        kwargs["verify"] = True
        kwargs["requireCertificate"] = False
    try:
        return ssl.CertificateOptions(
            privateKey=private.original,
            certificate=leaf.original,
            extraCertChain=chain or None,
            raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
            **kwargs,
        )
    except Exception as e:
        raise ConfigError(f"TLS certificate and key do not match ({cert}, {key}): {e}") from None


@implementer(IOpenSSLServerConnectionCreator)
class ServerTLS:
    """What every TLS listener of a broker makes its connections with: the current server
    context (:attr:`options`). Replacing it (a reload) changes what new connections get;
    a connection made before keeps the context it was made with, so it stays open."""

    def __init__(self, options: ssl.CertificateOptions) -> None:
        self.options = options

    @classmethod
    def load(cls, cert: str, key: str, ca: str | None) -> ServerTLS:
        """The files read and checked (:func:`server_context_factory`); ConfigError, in
        one line, for any that cannot be used (the context is made now, so a key that does
        not match its certificate is found here, not at the first connection)."""
        options = server_context_factory(cert, key, ca)
        try:
            options.getContext()
        except Exception as e:
            raise ConfigError(f"bad TLS certificate or key ({cert}, {key}): {e}") from None
        return cls(options)

    def serverConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        return SSL.Connection(self.options.getContext(), None)


def certificate_names(certificate: x509.Certificate) -> frozenset[str]:
    """The names a certificate proves: Common Name(s) and DNS/email SANs."""
    names = {
        str(attr.value) for attr in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    }
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        pass
    else:
        names.update(san.get_values_for_type(x509.DNSName))
        names.update(san.get_values_for_type(x509.RFC822Name))
    return frozenset(names)


def peer_names(transport: Any) -> frozenset[str] | None:
    """Names proven by the verified client certificate on ``transport``, or ``None``.

    The server only asks for a certificate when a CA is configured, and the handshake fails
    for one that does not verify, so any certificate seen here is verified.
    """
    get = getattr(transport, "getPeerCertificate", None)
    if get is None:
        return None
    try:
        peer = get()
    except Exception:
        return None
    if peer is None:
        return None
    return certificate_names(peer.to_cryptography())
