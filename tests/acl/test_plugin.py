"""The ACL plugin in a broker (in memory, msgbroker.testing): nothing asked per request
without a file, the file loaded at start (a bad one stops the broker), and reload through
``msgbroker_reload``: a bad file refused with the old rules kept, a new one in place
(subscriptions it refuses dropped), the ACL added or removed."""

from __future__ import annotations

import pytest

from msgbroker import BrokerConfig, ConfigError
from msgbroker.plugins.acl import plugin as acl_plugin
from msgbroker.plugins.mm2 import codec
from msgbroker.plugins.mm2.codec import MessageFrame
from msgbroker.plugins.sbus.addresses import Credentials
from msgbroker.reasons import CloseReason
from msgbroker.testing import connect, drive, make_broker
from tests.mm2.test_session import frames, logged_in

ACL = """\
user alice
topic readwrite chat/
user bob
topic read chat/
"""


def config(path=None, **more) -> BrokerConfig:
    sections = {"acl": {"file": str(path)}} if path is not None else {}
    return BrokerConfig(auth=("open",), sections=sections, **more)


def acl_file(tmp_path, text: str, name: str = "acl"):
    path = tmp_path / name
    path.write_text(text)
    return path


def started(cfg: BrokerConfig):
    broker = make_broker(cfg)
    broker.started()
    return broker


def ssmp(broker, identity: str):
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN %s open\n" % identity.encode())
    assert conn.received() == b"200\n"
    return conn


def test_without_a_file_nothing_authorizes():
    broker = started(config())
    assert not broker.authorizes  # the protocols' fast paths stay
    assert broker.plugins.get(acl_plugin.ACTIVE) is None
    assert not hasattr(acl_plugin, "msgbroker_authorize")  # the entry point never does


def test_with_a_file_default_deny_and_the_rules(tmp_path):
    broker = started(config(acl_file(tmp_path, ACL)))
    assert broker.authorizes
    alice, bob, carol = ssmp(broker, "alice"), ssmp(broker, "bob"), ssmp(broker, "carol")
    alice.send(b"SUBSCRIBE chat/a\nMCAST chat/a hi\nMCAST news x\n")
    assert alice.received() == b"200\n200\n405\n"
    bob.send(b"SUBSCRIBE chat/a\nMCAST chat/a no\n")
    assert bob.received() == b"200\n405\n"
    carol.send(b"SUBSCRIBE chat/a\nMCAST chat/a no\nUCAST alice x\nBCAST x\n")
    assert carol.received() == b"405\n405\n405\n405\n"
    alice.send(b"MCAST chat/a again\n")
    assert alice.received() == b"200\n"
    assert bob.received() == b"000 alice MCAST chat/a again\n"


def test_a_bad_file_stops_the_broker(tmp_path):
    broker = make_broker(config(acl_file(tmp_path, "user alice\ntopic a*b\n")))
    with pytest.raises(ConfigError, match=r"ACL file .*acl line 2: the pattern 'a\*b'"):
        broker.started()
    with pytest.raises(ConfigError, match="cannot read the ACL file"):
        make_broker(config(tmp_path / "missing")).started()


def test_reload_puts_a_new_file_in_place(tmp_path):
    broker = started(config(acl_file(tmp_path, ACL)))
    bob = ssmp(broker, "bob")
    bob.send(b"MCAST chat/a x\n")
    assert bob.received() == b"405\n"
    new = config(acl_file(tmp_path, "user bob\ntopic readwrite chat/\n", "acl2"))
    broker.reload(new)
    assert broker.config is not new and broker.config == new  # resolved, then taken
    bob.send(b"MCAST chat/a x\n")
    assert bob.received() == b"200\n"


def test_reload_refuses_a_bad_file_and_keeps_the_old_rules(tmp_path):
    old = config(acl_file(tmp_path, ACL))
    broker = started(old)
    bad = config(acl_file(tmp_path, "user bob\ntopic readwrite chat/\nbogus\n", "bad"))
    with pytest.raises(ConfigError, match=r"ACL file .*bad line 3: unknown keyword 'bogus'"):
        broker.reload(bad)
    assert broker.config == old
    bob = ssmp(broker, "bob")
    bob.send(b"MCAST chat/a x\n")
    assert bob.received() == b"405\n"  # still the old rules
    with pytest.raises(ConfigError, match="cannot read the ACL file"):
        broker.reload(config(tmp_path / "gone"))


def test_reload_drops_the_subscriptions_the_new_rules_refuse(tmp_path):
    broker = started(config(acl_file(tmp_path, ACL)))
    alice, bob = ssmp(broker, "alice"), ssmp(broker, "bob")
    alice.send(b"SUBSCRIBE chat/a PRESENCE\nSUBSCRIBE chat/b\n")
    assert alice.received() == b"200\n200\n"
    bob.send(b"SUBSCRIBE chat/a\nSUBSCRIBE chat/b\n")
    assert bob.received() == b"200\n200\n"
    assert alice.received() == b"000 bob SUBSCRIBE chat/a\n"
    broker.reload(config(acl_file(tmp_path, ACL + "topic deny chat/a\n", "acl2")))
    # bob no longer may read chat/a: dropped, and alice hears him leave
    assert alice.received() == b"000 bob UNSUBSCRIBE chat/a\n"
    alice.send(b"MCAST chat/a one\nMCAST chat/b two\n")
    assert alice.received() == b"200\n200\n"
    assert bob.received() == b"000 alice MCAST chat/b two\n"
    bob.send(b"UNSUBSCRIBE chat/a\n")
    assert bob.received() == b"404\n"


def test_reload_adds_and_removes_the_acl(tmp_path):
    broker = started(config())
    carol = ssmp(broker, "carol")
    carol.send(b"SUBSCRIBE news\n")
    assert carol.received() == b"200\n"
    broker.reload(config(acl_file(tmp_path, ACL)))
    assert broker.authorizes
    carol.send(b"MCAST news x\n")
    assert carol.received() == b"405\n"
    carol.send(b"UNSUBSCRIBE news\n")  # carol may not read news: her subscription went
    assert carol.received() == b"404\n"
    broker.reload(config())
    assert not broker.authorizes
    assert broker.plugins.get(acl_plugin.ACTIVE) is None
    carol.send(b"MCAST news x\n")
    assert carol.received() == b"200\n"


def test_the_acl_leaves_with_the_broker(tmp_path):
    broker = started(config(acl_file(tmp_path, ACL)))
    broker.stopped()
    assert not broker.authorizes


def test_reload_forgets_the_routes_sbus_remembered(tmp_path):
    """The ACL decides per topic, so an sbus publisher remembers the recipients of a key it
    may publish on; a reload that refuses the key must end that at once."""
    broker = started(config(acl_file(tmp_path, "user sbus:*\ntopic readwrite k/\n")))
    sub = drive(broker, "sbus", host="", credentials=Credentials(1, 1000, 10))
    sub.feed(b"SUB k/")
    pub = drive(broker, "sbus", host="", credentials=Credentials(1, 1000, 11))
    pub.feed(b"MSG k/a\0one")
    pub.feed(b"MSG k/a\0two")  # from the remembered route
    broker.reload(config(acl_file(tmp_path, "user sbus:*\ntopic read k/\n", "acl2")))
    pub.feed(b"MSG k/a\0three")
    assert pub.session.close_reason is CloseReason.NOT_AUTHORIZED
    assert sub.received_packets() == [b"MSG k/a\0one", b"MSG k/a\0two"]


def test_mm2_requests_refused_close_as_not_authorized(tmp_path):
    """Micromessage2's answer to a refused request is an ERROR frame and closing, as for a
    broken rule; the session's end says which it was."""
    broker = started(config(acl_file(tmp_path, "user pub\ntopic write allowed\n")))
    for request in (
        frames(MessageFrame(1, "refused", b"x")),
        frames(codec.encode_pubsub(codec.Subscribe("allowed"))),
        frames(MessageFrame(1, "@someone", b"x")),
    ):
        driver, _ = logged_in(broker, "pub", "pubsub")
        driver.feed(request)
        answers = codec.FrameDecoder().feed(driver.received())
        assert [type(f) for f in answers] == [codec.ErrorFrame]
        assert driver.session.close_reason is CloseReason.NOT_AUTHORIZED
        assert driver.session.close_detail.startswith("not allowed to ")
