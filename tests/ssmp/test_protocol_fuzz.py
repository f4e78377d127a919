"""Hypothesis against the whole SSMP server (in memory): whatever a client sends, the
server answers per the spec or closes that connection — no exception escapes, and a
bystander connection keeps working."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker import BrokerConfig
from msgbroker.testing import connect, make_broker

ids = st.text(alphabet="abcxyz.:@/_-+=~019", min_size=1, max_size=6)
text_payloads = st.binary(min_size=1, max_size=40).filter(lambda b: b[0] > 3 and b"\n" not in b)


@st.composite
def requests(draw):
    kind = draw(
        st.sampled_from(
            [
                "SUBSCRIBE",
                "UNSUBSCRIBE",
                "MCAST",
                "UCAST",
                "BCAST",
                "PING",
                "PONG",
                "LOGIN",
                "FOO",
                "garbage",
                "binary",
                "CLOSE",
            ]
        )
    )
    if kind == "SUBSCRIBE":
        return b"SUBSCRIBE %s%s\n" % (
            draw(ids).encode(),
            draw(st.sampled_from([b"", b" PRESENCE"])),
        )
    if kind == "UNSUBSCRIBE":
        return b"UNSUBSCRIBE %s\n" % draw(ids).encode()
    if kind in ("MCAST", "UCAST"):
        return b"%s %s %s\n" % (kind.encode(), draw(ids).encode(), draw(text_payloads))
    if kind == "BCAST":
        return b"BCAST %s\n" % draw(text_payloads)
    if kind == "binary":
        data = draw(st.binary(min_size=1, max_size=50))
        return b"MCAST t " + (len(data) - 1).to_bytes(2, "big") + data + b"\n"
    if kind == "LOGIN":
        return b"LOGIN %s open\n" % draw(ids).encode()
    if kind == "garbage":
        return draw(st.binary(max_size=30))
    if kind == "CLOSE":
        return b"CLOSE\n" if draw(st.booleans()) and draw(st.booleans()) else b"PING\n"
    return b"%s\n" % kind.encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 2), requests()), max_size=30),
    st.lists(st.integers(1, 40), min_size=1, max_size=5),
)
def test_no_input_escapes_as_an_exception_or_hurts_a_bystander(script, splits):
    broker = make_broker(BrokerConfig(auth=("open",)))
    bystander = connect(broker, "ssmp")
    bystander.send(b"LOGIN bystander open\nSUBSCRIBE t PRESENCE\n")
    assert bystander.received() == b"200\n200\n"
    clients = [connect(broker, "ssmp") for _ in range(3)]
    for i, c in enumerate(clients):
        c.send(b"LOGIN c%d open\n" % i)
    for index, request in script:
        client = clients[index]
        rest = request
        for size in splits:  # deliver in uneven pieces
            piece, rest = rest[:size], rest[size:]
            if piece:
                client.send(piece)
        if rest:
            client.send(rest)
    for c in clients:
        out = c.received()
        if c.closed:
            # a closed connection's last reply is 200 (CLOSE), 400, 401 or 405, or nothing
            assert (
                out == b""
                or out.endswith((b"200\n", b"400\n", b"405\n", b"401 open\n"))
                or (c.session.close_reason in ("kicked", "slow consumer"))
            )
    bystander.received()
    bystander.send(b"PING\n")
    assert bystander.received() == b"000 . PONG\n"
    assert not bystander.closed
    # every closed client is gone from the hub; every open one is still known
    open_sessions = {c.session for c in clients if not c.closed} | {bystander.session}
    assert set(broker.sessions) == open_sessions
    for topic in broker.hub.topics.values():
        assert set(topic.members) <= open_sessions
