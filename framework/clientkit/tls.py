"""TLS for clients, from the same files for both kinds: :func:`ssl_context` (an
``ssl.SSLContext`` for the blocking clients), :func:`client_tls_options` (a Twisted client
connection creator) and :class:`TLSClientEndpoint` (TLS on a given reactor).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from zope.interface import implementer

__all__ = ["TLSClientEndpoint", "client_tls_options", "ssl_context"]


def ssl_context(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext:
    """A client context: TLS 1.2 at least, the server verified against ``ca`` (a PEM file;
    default: the system's trust store), presenting ``cert`` with ``key`` (PEM files; ``key``
    may be inside ``cert``) when given. ``OSError`` or ``ssl.SSLError`` for bad files."""
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        context.load_cert_chain(cert, key)
    return context


def client_tls_options(
    hostname: str, ca: str | None = None, cert: str | None = None, key: str | None = None
) -> Any:
    """A Twisted client connection creator: verify the server as ``hostname`` (a name or an
    IP address) against ``ca`` (PEM file; default: the system's trust store), presenting the
    client certificate ``cert`` with ``key`` (PEM files; ``key`` may be inside ``cert``)."""
    from twisted.internet import ssl as tssl

    trust = tssl.Certificate.loadPEM(Path(ca).read_bytes()) if ca else None
    client = None
    if cert:
        pem = Path(cert).read_bytes() + (b"\n" + Path(key).read_bytes() if key else b"")
        client = tssl.PrivateCertificate.loadPEM(pem)
    return tssl.optionsForClientTLS(hostname, trustRoot=trust, clientCertificate=client)


@implementer(IStreamClientEndpoint)
class TLSClientEndpoint:
    """``endpoint`` with TLS (``creator``: a client connection creator), like Twisted's
    ``wrapClientTLS`` but with TLS's small-write aggregation on ``clock`` (the reactor the
    connection runs on), not on the global reactor."""

    def __init__(self, creator: Any, endpoint: Any, clock: Any) -> None:
        self.creator = creator
        self.endpoint = endpoint
        self.clock = clock

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        from twisted.protocols.tls import TLSMemoryBIOFactory

        wrapper = TLSMemoryBIOFactory(self.creator, True, factory, clock=self.clock)
        d: defer.Deferred[Any] = self.endpoint.connect(wrapper)
        return d.addCallback(lambda proto: proto.wrappedProtocol)
