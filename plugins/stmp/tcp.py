"""STMP over TCP (``stmp`` listeners): the binary serialization with PS, on a byte stream.

Before login a message may be at most ``prelogin-max-frame`` bytes (header, fields, PS
and payload): a larger one is a protocol error as soon as its PS is read, so an
unauthenticated peer never makes the broker buffer more than that. After login the
payload limit (16 MiB) applies.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from msgbroker.errors import RemoteProtocolError
from msgbroker.legacy import BrokerProtocol

from . import codec
from .codec import Encoding
from .encoders import delivery_encoder
from .protocol import STMPConnection

log = Logger(namespace="msgbroker.stmp")


class STMPServerProtocol(BrokerProtocol):
    """STMP over TCP: binary serialization with PS."""

    name = "stmp"
    encode = staticmethod(delivery_encoder("binary", Encoding.JSON))
    stmp: STMPConnection | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        # the STMP connection runs its own login timer and heartbeat
        if self._login_timer is not None and self._login_timer.active():
            self._login_timer.cancel()
        self._login_timer = None
        factory: Any = self.factory
        self._decoder = codec.BinaryDecoder(
            factory.max_payload, self.broker.config.prelogin_max_frame
        )
        #: bytes that arrived while the input was held (TLS may hand over more than one
        #: chunk per socket read), parsed on release
        self._kept: list[bytes] = []
        self.stmp = STMPConnection(
            self.broker,
            factory.router,
            self.session,
            "binary",
            self.peer_certificate_names,
        )
        self.stmp.on_login = self._logged_in
        self.stmp.on_release = self._released

    def _logged_in(self) -> None:
        self._decoder.max_message = None

    def dataReceived(self, data: bytes) -> None:
        stmp = self.stmp
        if stmp is None or stmp.closed:
            return
        if stmp.holding:
            self._kept.append(data)
            return
        self._parse(stmp, data)

    def _released(self) -> None:
        stmp = self.stmp
        if stmp is not None and not stmp.closed:
            kept, self._kept = b"".join(self._kept), []
            self._parse(stmp, kept)

    def _parse(self, stmp: STMPConnection, data: bytes) -> None:
        # Runs of pipelined requests are only worth it (and only taken) after login; before
        # it, one message at a time, so a held input stops right after the login that holds
        # it and what follows stays unparsed in the decoder.
        decoder = self._decoder
        logged_in = self.session.identity is not None
        messages = decoder.feed_runs(data) if logged_in else decoder.feed(data)
        try:
            for message in messages:
                stmp.received(message)
                if stmp.closed or stmp.holding:
                    break
        except RemoteProtocolError as e:
            log.debug("stmp {host}: protocol error: {why}", host=self.session.host, why=str(e))
            stmp.close(f"protocol error: {e}")
        finally:
            messages.close()  # keeps the bytes after the last message handled
        self.broker.batcher.flush()  # what this chunk caused: one write per recipient

    def connectionLost(self, reason: Any = None) -> None:
        if self.stmp is not None:
            self.stmp.lost()
        super().connectionLost(reason)
