"""Pre-encoded frames for the protocols the harness drives: SSMP 1.1, STMP 0.1 (binary, over
TCP), Micromessage2 (MM2) and MQTT 3.1.1.

No client library: every frame is built here as bytes, once, before a measurement starts.
Each protocol is described by a small object with the same shape, so a scenario is written
once and run against either server:

- ``subscriber_setup(ident, topic)``: bytes to send on a fresh connection to log in and
  subscribe, and the exact bytes the server answers with;
- ``publisher_setup(ident)``: the same for a connection that only publishes;
- ``publish(topic, payload)``: one publish request;
- ``publish_reply``: what the server answers per publish (SSMP ``200\\n``; nothing for MQTT QoS 0);
- ``delivered(sender, topic, payload)``: the exact frame a subscriber receives;
- ``ping`` / ``pong``: a liveness request and its answer.
"""

from __future__ import annotations

import json
import struct
from urllib.parse import quote


class SSMP:
    name = "ssmp"
    publish_reply = b"200\n"
    ping = b"PING\n"
    pong = b"000 . PONG\n"

    @staticmethod
    def login(ident: str) -> bytes:
        return b"LOGIN %s open\n" % ident.encode()

    def subscriber_setup(self, ident: str, *topics: str) -> tuple[bytes, bytes]:
        subscribe = b"".join(b"SUBSCRIBE %s\n" % t.encode() for t in topics)
        return self.login(ident) + subscribe, b"200\n" * (1 + len(topics))

    def publisher_setup(self, ident: str) -> tuple[bytes, bytes]:
        return self.login(ident), b"200\n"

    @staticmethod
    def publish(topic: str, payload: bytes) -> bytes:
        return b"MCAST %s %s\n" % (topic.encode(), payload)

    @staticmethod
    def delivered(sender: str, topic: str, payload: bytes) -> bytes:
        return b"000 %s MCAST %s %s\n" % (sender.encode(), topic.encode(), payload)

    # -- UCAST echo -----------------------------------------------------------------------

    @staticmethod
    def ucast(target: str, payload: bytes) -> bytes:
        return b"UCAST %s %s\n" % (target.encode(), payload)

    @staticmethod
    def ucast_event(sender: str, target: str, payload: bytes) -> bytes:
        return b"000 %s UCAST %s %s\n" % (sender.encode(), target.encode(), payload)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(s: bytes) -> bytes:
    return struct.pack("!H", len(s)) + s


class MQTT:
    """MQTT 3.1.1, QoS 0 only, clean sessions, keepalive off."""

    name = "mosquitto"
    publish_reply = b""
    ping = b"\xc0\x00"  # PINGREQ
    pong = b"\xd0\x00"  # PINGRESP
    connack = b"\x20\x02\x00\x00"

    @staticmethod
    def connect(client_id: str, keepalive: int = 0) -> bytes:
        body = _string(b"MQTT") + bytes([4, 0x02]) + struct.pack("!H", keepalive)
        body += _string(client_id.encode())
        return b"\x10" + _varint(len(body)) + body

    @staticmethod
    def subscribe(packet_id: int, topic: str) -> bytes:
        body = struct.pack("!H", packet_id) + _string(topic.encode()) + b"\x00"
        return b"\x82" + _varint(len(body)) + body

    @staticmethod
    def suback(packet_id: int) -> bytes:
        return b"\x90\x03" + struct.pack("!H", packet_id) + b"\x00"

    def subscriber_setup(self, ident: str, *topics: str) -> tuple[bytes, bytes]:
        subscribe = b"".join(self.subscribe(i + 1, t) for i, t in enumerate(topics))
        acks = b"".join(self.suback(i + 1) for i in range(len(topics)))
        return self.connect(ident) + subscribe, self.connack + acks

    def publisher_setup(self, ident: str) -> tuple[bytes, bytes]:
        return self.connect(ident), self.connack

    @staticmethod
    def publish(topic: str, payload: bytes) -> bytes:
        body = _string(topic.encode()) + payload
        return b"\x30" + _varint(len(body)) + body

    def delivered(self, sender: str, topic: str, payload: bytes) -> bytes:
        return self.publish(topic, payload)


class STMP:
    """STMP 0.1 binary serialization over TCP, JSON payloads (encoding 2), the broker's
    built-in actions 0.0.1.0/24. Encoded here with the standard library only (the
    broker's own codec is not needed to run the harness; ``check_stmp_against_codec``
    compares with it when it is importable).

    Request: 0x50 (kind 1, encoding 2) + id u16 + action u32 + PS u32 + payload;
    response Ok without payload: 0xC0 + id u16 + 0x00; delivery: notify 0.0.1.16 =
    0x90 + 0x00000110 + PS u32 + JSON ``{"from","kind","topic","data"}``."""

    name = "stmp"
    publish_reply = b"\xc0\x00\x00\x00"  # only its length matters (ids vary)
    ping = b"\x00"
    pong = b""  # the server answers no ping: the harness does not use it
    LOGIN, SUBSCRIBE, PUBLISH, DELIVERY = 0x0101, 0x0102, 0x0104, 0x0110

    def __init__(self) -> None:
        self._next_id = 0

    def _id(self) -> int:
        """Request ids cycle through 1..65535 (u16; 0 is the version check's)."""
        self._next_id = self._next_id % 0xFFFF + 1
        return self._next_id

    @staticmethod
    def _json(obj: dict) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def request(cls, ident: int, action: int, obj: dict) -> bytes:
        body = cls._json(obj)
        return b"\x50" + struct.pack(">HII", ident, action, len(body)) + body

    @staticmethod
    def ok(ident: int) -> bytes:
        return b"\xc0" + struct.pack(">H", ident) + b"\x00"

    def subscriber_setup(self, ident: str, *topics: str) -> tuple[bytes, bytes]:
        out = [self.request(1, self.LOGIN, {"id": ident, "scheme": "open"})]
        out += [self.request(2 + i, self.SUBSCRIBE, {"topic": t}) for i, t in enumerate(topics)]
        return b"".join(out), b"".join(self.ok(i + 1) for i in range(1 + len(topics)))

    def publisher_setup(self, ident: str) -> tuple[bytes, bytes]:
        return self.request(1, self.LOGIN, {"id": ident, "scheme": "open"}), self.ok(1)

    def publish(self, topic: str, payload: bytes) -> bytes:
        return self.request(
            self._id(), self.PUBLISH, {"topic": topic, "data": payload.decode("ascii")}
        )

    @classmethod
    def delivered(cls, sender: str, topic: str, payload: bytes) -> bytes:
        body = cls._json({"from": sender, "kind": "mcast", "topic": topic,
                          "data": payload.decode("ascii")})
        return b"\x90" + struct.pack(">II", cls.DELIVERY, len(body)) + body


class MM2:
    """Micromessage2 over TCP with the ``pubsub`` extension and, with ``window``, batch-ack
    (``max-count=window``) on both sides. Encoded with the standard library only
    (``check_mm2_against_codec`` compares with msgbroker's codec when importable).

    Handshake message: ``major u8=1, minor u8=1, flags u8=0, idlen u8, identity, reqlen
    u16, required, optlen u16, optional``. The client sends step 1 (hello: optional
    ``pubsub`` or ``pubsub;batch-ack``) and, pipelined right after it, step 3 (the active
    lists: ``pubsub`` or ``pubsub;batch-ack:max-count=N``); the server answers step 2 only.
    Extension ids count from 1 in step-3 order: pubsub 1, batch-ack 2.

    COMMAND: 0x01 + len u8 + ``subscribe;destination=<urlenc topic>`` (no reply).
    MESSAGE: flags (0x00, or 0x08 LARGE and a u32 length for payloads over 255 bytes) +
    seq u16 + destlen u8 + destination + proplen u16 (0) + len + payload; no reply without
    acks. Each direction numbers its messages 1, 2, ..., 65535, then 1 again; a bench
    payload starts with its 8-digit message index, so message ``i`` has seq
    ``i % 65535 + 1`` in both directions (a delivery carries the subscriber's own number:
    the same, since every subscriber gets every message from the first).
    Ack (batch-ack): EXTENSION 0x02 + ext id u8 + len u8 = 2 + seq u16, cumulative."""

    name = "mm2"
    ping = b""
    pong = b""  # Micromessage2 has no ping: the harness does not use it
    SEQ_CYCLE = 0xFFFF
    PUBSUB_ID, ACK_ID = 1, 2
    #: our step 2: identity msgbroker, nothing required, pubsub and batch-ack offered
    SERVER_HELLO = b"\x01\x01\x00\x09msgbroker\x00\x00\x00\x10pubsub;batch-ack"

    def __init__(self, window: int | None = None) -> None:
        #: batch-ack max-count on both the publisher and the subscribers (None: no acks)
        self.window = window
        self.publish_reply = b""  # with acks, one ack per chunk the server reads: unknown
        # the hello names the extensions without properties and step 3 sets the window (the
        # client's final word): step 2 is then SERVER_HELLO whether the server answers with
        # its own offers or with the client's suggestions first and then its offers
        self._hello = b"pubsub" if window is None else b"pubsub;batch-ack"
        self._active = b"pubsub" if window is None else b"pubsub;batch-ack:max-count=%d" % window

    @staticmethod
    def handshake(identity: str, required: bytes = b"", optional: bytes = b"") -> bytes:
        ident = identity.encode("ascii")
        return (bytes((1, 1, 0, len(ident))) + ident + struct.pack(">H", len(required))
                + required + struct.pack(">H", len(optional)) + optional)

    @staticmethod
    def _length(size: int) -> tuple[int, bytes]:
        """(LARGE or 0, the length field): LARGE exactly when more than 255 bytes."""
        return (0, bytes((size,))) if size <= 255 else (0x08, struct.pack(">I", size))

    @classmethod
    def command(cls, text: bytes) -> bytes:
        large, length = cls._length(len(text))
        return bytes((0x01 | large,)) + length + text

    @classmethod
    def subscribe(cls, topic: str) -> bytes:
        return cls.command(b"subscribe;destination=" + quote(topic, safe="").encode("ascii"))

    def _login(self, ident: str) -> bytes:
        # step 1 and step 3 in one write (the server reads step 3 after answering step 1)
        return self.handshake(ident, b"", self._hello) + self.handshake(ident, b"", self._active)

    def subscriber_setup(self, ident: str, *topics: str) -> tuple[bytes, bytes]:
        subscribe = b"".join(self.subscribe(t) for t in topics)
        return self._login(ident) + subscribe, self.SERVER_HELLO

    def publisher_setup(self, ident: str) -> tuple[bytes, bytes]:
        return self._login(ident), self.SERVER_HELLO

    @classmethod
    def seq_of(cls, index: int) -> int:
        """The sequence number of the ``index``-th message (from 0): 1..65535, then 1."""
        return index % cls.SEQ_CYCLE + 1

    @classmethod
    def message(cls, seq: int, topic: str, payload: bytes) -> bytes:
        dest = topic.encode("ascii")
        large, length = cls._length(len(payload))
        return (struct.pack(">BHB", large, seq, len(dest)) + dest + b"\x00\x00" + length
                + payload)

    @classmethod
    def publish(cls, topic: str, payload: bytes) -> bytes:
        return cls.message(cls.seq_of(int(payload[:8])), topic, payload)

    @classmethod
    def delivered(cls, sender: str, topic: str, payload: bytes) -> bytes:
        return cls.message(cls.seq_of(int(payload[:8])), topic, payload)

    @staticmethod
    def unsequenced(frame: bytes) -> bytes:
        """A MESSAGE frame with its sequence number zeroed: a delivery's is the subscriber's
        own count, so it says in which order messages arrived, not which message it is."""
        return frame[:1] + b"\0\0" + frame[3:]

    @classmethod
    def ack(cls, seq: int) -> bytes:
        """The batch-ack EXTENSION frame acknowledging every message up to ``seq``."""
        return struct.pack(">BBBH", 0x02, cls.ACK_ID, 2, seq)


class Mixed:
    """A publisher speaking one protocol, subscribers another, on the same broker."""

    def __init__(self, pub, sub) -> None:
        self.pub, self.sub = pub, sub
        self.name = f"{pub.name}->{sub.name}"


def check_stmp_against_codec() -> str | None:
    """Compare STMP's frames with msgbroker's codec when importable: None if equal (or the
    codec is not importable here), else what differs."""
    try:
        from msgbroker.plugins.stmp.codec import Notify, Request, encode_binary, parse_action
        from msgbroker.plugins.stmp.payloads import encode_payload
    except ImportError:
        return None
    proto = STMP()
    data = payload(7, 64)
    want = encode_binary(Request(1, parse_action("0.0.1.4"), 2, encode_payload(
        {"topic": "bench", "data": data.decode()}, 2)))
    got = proto.publish("bench", data)
    if got != want:
        return f"publish: {got!r} != codec {want!r}"
    want = encode_binary(Notify(parse_action("0.0.1.16"), 2, encode_payload(
        {"from": "pub", "kind": "mcast", "topic": "bench", "data": data.decode()}, 2)))
    got = proto.delivered("pub", "bench", data)
    if got != want:
        return f"delivery: {got!r} != codec {want!r}"
    return None


def check_mm2_against_codec() -> str | None:
    """Compare MM2's frames with msgbroker's Micromessage2 codec when importable: None if
    equal (or the codec is not importable here), else what differs."""
    try:
        from msgbroker.plugins.mm2 import codec
    except ImportError:
        return None
    checks = []
    for window in (None, 100):
        proto = MM2(window)
        suggested = ["pubsub"] if window is None else ["pubsub", "batch-ack"]
        active = ["pubsub"] if window is None else [
            "pubsub", codec.Extension("batch-ack", (("max-count", str(window)),))]
        hello = codec.encode_handshake(codec.Handshake("sub0", (), suggested))
        confirm = codec.encode_handshake(codec.Handshake("sub0", (), active))
        subscribe = codec.encode_frame(codec.encode_pubsub(codec.Subscribe("bench")))
        checks.append((f"setup (window {window})", proto.subscriber_setup("sub0", "bench")[0],
                       hello + confirm + subscribe))
        ids = codec.active_extensions(codec.HandshakeDecoder().feed(confirm))
        if window and ids.id_of("batch-ack") != MM2.ACK_ID:
            return f"batch-ack is extension {ids.id_of('batch-ack')}, not {MM2.ACK_ID}"
    checks.append(("server hello", MM2.SERVER_HELLO, codec.encode_handshake(
        codec.Handshake("msgbroker", (), ("pubsub", "batch-ack")))))
    proto = MM2()
    for index, size in ((7, 64), (65534, 64), (65535, 300), (200_000, 255), (3, 256)):
        data = payload(index, size)
        want = codec.encode_frame(codec.MessageFrame(index % 65535 + 1, "bench", data))
        checks.append((f"message {index} ({size} B)", proto.publish("bench", data), want))
        checks.append((f"delivery {index}", proto.delivered("pub", "bench", data), want))
    checks.append(("ack", MM2.ack(65535), codec.encode_frame(codec.ack_frame(2, 65535))))
    for what, got, want in checks:
        if got != want:
            return f"{what}: {got!r} != codec {want!r}"
    return None


def parse_mqtt_packets(buf: bytearray) -> list[tuple[int, bytes]]:
    """Split complete MQTT packets off the front of ``buf`` (consumed in place):
    ``[(first header byte, body), ...]``."""
    out = []
    pos = 0
    end = len(buf)
    while pos + 2 <= end:
        header = buf[pos]
        length = 0
        shift = 0
        i = pos + 1
        while True:
            if i >= end:
                del buf[:pos]
                return out
            byte = buf[i]
            length |= (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
            if shift > 21:
                raise ValueError("bad MQTT remaining length")
        if i + length > end:
            break
        out.append((header, bytes(buf[i : i + length])))
        pos = i + length
    del buf[:pos]
    return out


def payload(seq: int, size: int) -> bytes:
    """A text payload of exactly ``size`` bytes (>= 8) carrying ``seq``: no LF, no leading
    NUL/SOH/STX/ETX, so SSMP treats it as text."""
    head = b"%08d" % (seq % 100_000_000)
    return head + b"x" * (size - len(head))


PROTOCOLS = {
    "ssmp": SSMP(),
    "mosquitto": MQTT(),
    "stmp": STMP(),
    "ssmp->stmp": Mixed(SSMP(), STMP()),
    "mm2": MM2(),
}
