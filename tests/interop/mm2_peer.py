"""The Micromessage2 adapter of the interop matrix: a raw socket and the sans-IO codec only.

Micromessage2 differs from the other protocols in ways the matrix must know:

- nothing is answered: a COMMAND or a MESSAGE gets no reply, so a request is followed by a
  *barrier* (a MESSAGE to ``@self``, which comes back once everything before it was
  handled: the broker handles one connection's frames in order);
- a delivered MCAST does not say who sent it: its event's sender is :data:`UNKNOWN`;
- there is no presence, no broadcast, no anonymous identity, and a unicast to nobody is
  not refused (there is no answer to refuse it with).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar

from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import Handshake, MessageFrame, Subscribe, Unsubscribe
from msgbroker.plugins.mm2.properties import is_valid_name
from tests.interop.peers import WAIT, Closed, Event, Peer

#: the sender of an MCAST as a Micromessage2 subscriber sees it: not said
UNKNOWN = ""
_barriers = itertools.count(1)


class MM2Peer(Peer):
    name = "mm2"
    listener = "mm2"
    NOT_FOUND = None  # a unicast to nobody is not refused
    #: what the protocol has (the matrix leaves out tests of what it has not)
    has_presence: ClassVar[bool] = False
    has_broadcast: ClassVar[bool] = False
    names_mcast_sender: ClassVar[bool] = False

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self._decoder = codec.FrameDecoder(max_payload=16 << 20)
        self._reassembler = codec.Reassembler()
        self._seq = 0
        self._barrier_seen: set[bytes] = set()

    @classmethod
    def carries(cls, sender: str, topic: str | None, data: bytes) -> bool:
        """Destinations are printable ASCII of at most 255 bytes: an MCAST's topic, or a
        UCAST's ``@sender``; any payload."""
        return is_valid_name(topic if topic is not None else "@" + sender)

    # -- requests ------------------------------------------------------------------------------

    def login(self, identity: str) -> None:
        hello = Handshake(identity, (), codec.parse_extension_list("pubsub"))
        self._write(codec.encode_handshake(hello))
        decoder = codec.HandshakeDecoder()
        deadline = time.monotonic() + WAIT
        reply = None
        while reply is None:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = self.sock.recv(65536)
            if not data:
                raise Closed("closed during the handshake")
            reply = decoder.feed(data)
        if not isinstance(reply, Handshake):
            raise Closed(f"handshake refused: {reply!r}")
        self._write(codec.encode_handshake(hello))
        self.identity = identity
        self._decoder.receive_data(decoder.trailing_data)
        self._barrier()

    def _call(self, requests: list[tuple[Any, ...]]) -> None:
        self._write(b"".join(self._frame(*request) for request in requests))
        self._barrier()

    def _frame(self, action: str, *args: Any) -> bytes:
        if action == "subscribe":
            return codec.encode_frame(codec.encode_pubsub(Subscribe(args[0])))
        if action == "unsubscribe":
            return codec.encode_frame(codec.encode_pubsub(Unsubscribe(args[0])))
        if action == "publish":
            return self._message(args[0], args[1])
        if action == "unicast":
            return self._message("@" + args[0], args[1])
        raise NotImplementedError(f"Micromessage2 has no {action}")

    def _message(self, destination: str, payload: bytes) -> bytes:
        self._seq = codec.next_seq(self._seq)
        return codec.encode_message(MessageFrame(self._seq, destination, payload))

    def _barrier(self) -> None:
        """A MESSAGE to ``@self``; returns once it came back (everything before it was
        handled). Events that arrive meanwhile stay queued, in order."""
        assert self.identity is not None
        marker = b"barrier-%d" % next(_barriers)
        self._write(self._message("@" + self.identity, marker))
        deadline = time.monotonic() + WAIT
        while marker not in self._barrier_seen:
            self._read(deadline, "the barrier")
        self._barrier_seen.discard(marker)

    def publish_and_close(self, topic: str, data: bytes) -> None:
        self._write(self._message(topic, data))
        self.close()

    # -- input ---------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            if isinstance(frame, codec.ErrorFrame):
                raise Closed(f"ERROR frame: {frame.text}")
            if not isinstance(frame, MessageFrame):
                continue
            whole = self._reassembler.feed(frame)
            if whole is None:
                continue
            destination = whole.destination
            if destination.startswith("@"):
                sender = destination[1:]
                if sender == self.identity and whole.payload.startswith(b"barrier-"):
                    self._barrier_seen.add(whole.payload)
                    continue
                self._events.append(Event(sender, "ucast", None, whole.payload))
            else:
                self._events.append(Event(UNKNOWN, "mcast", destination, whole.payload))
