"""Deciding (plugins/acl/policy.py): which rules apply to whom, deny over allow, default
deny, patterns with %u, certificate names, sbus subscription patterns, and the memory of
decisions."""

from __future__ import annotations

import pytest

from msgbroker.plugins.acl.policy import CACHE_LIMIT, Policy
from msgbroker.plugins.acl.rules import parse_acl

ACL = """\
topic write public/announcements
topic unicast ops
user alice
topic readwrite chat/
topic deny chat/admin/
topic unicast bob
topic broadcast
user bob
topic read chat/
user sbus:1000:*
topic read sensors/
topic deny read sensors/private/
cert device-17.example.com
topic publish sensors/17/
pattern readwrite users/%u/
pattern unicast %u
pattern subscribe public/
"""


@pytest.fixture(scope="module")
def policy():
    return Policy(parse_acl(ACL))


def test_a_user_has_its_rules(policy):
    alice = policy.grants("alice")
    assert alice.allows("publish", "chat/general")
    assert alice.allows("subscribe", "chat/general/x")
    assert not alice.allows("publish", "chat")  # chat/ needs something below
    assert alice.allows("unicast", "bob")
    assert not alice.allows("unicast", "carol")
    assert alice.allows("broadcast", None)


def test_deny_wins_whatever_the_order(policy):
    alice = policy.grants("alice")
    assert not alice.allows("publish", "chat/admin/x")
    assert not alice.allows("subscribe", "chat/admin/")


def test_default_deny(policy):
    carol = policy.grants("carol")  # no user block: the patterns only
    assert not carol.allows("publish", "chat/general")
    assert not carol.allows("broadcast", None)
    assert not policy.grants("bob").allows("publish", "chat/x")  # bob may only read
    assert not policy.grants("alice").allows("restart", "chat/x")  # an unknown action


def test_patterns_apply_to_everyone_with_their_identity(policy):
    for name in ("alice", "carol", "sbus:1000:7"):
        grants = policy.grants(name)
        assert grants.allows("publish", f"users/{name}/inbox")
        assert grants.allows("unicast", name)
        assert grants.allows("subscribe", "public/x")
        assert not grants.allows("publish", "users/someone-else/inbox")


def test_an_identity_is_literal_in_patterns():
    policy = Policy(parse_acl("pattern publish users/%u/\n"))
    assert policy.grants("x*").allows("publish", "users/x*/a")
    assert not policy.grants("x*").allows("publish", "users/xy/a")
    assert not policy.grants("a/b").allows("publish", "users/a/c/d")
    assert policy.grants("a/b").allows("publish", "users/a/b/d")


def test_the_anonymous_identity(policy):
    anonymous = policy.grants(".")
    assert anonymous.allows("publish", "public/announcements")
    assert anonymous.allows("unicast", "ops")
    assert anonymous.allows("subscribe", "public/x")  # a pattern without %u
    assert not anonymous.allows("publish", "users/./x")  # patterns with %u: not for it
    assert not anonymous.allows("unicast", ".")
    # and the anonymous block is nobody else's
    assert not policy.grants("alice").allows("publish", "public/announcements")


def test_certificate_names(policy):
    device = policy.grants("dev", frozenset({"device-17.example.com", "other"}))
    assert device.allows("publish", "sensors/17/temperature")
    assert not device.allows("publish", "sensors/18/temperature")
    assert not policy.grants("dev").allows("publish", "sensors/17/temperature")
    # the block is the certificate's, whatever identity the session took
    assert policy.grants("alice", frozenset({"device-17.example.com"})).allows(
        "publish", "sensors/17/x"
    )


def test_user_prefixes(policy):
    sbus = policy.grants("sbus:1000:4242")
    assert sbus.allows("subscribe", "sensors/a")
    assert not sbus.allows("subscribe", "sensors/private/a")
    assert not policy.grants("sbus:1001:4242").allows("subscribe", "sensors/a")


def test_sbus_subscriptions_are_patterns(policy):
    """Allowed when an allowing rule contains the pattern and no deny rule overlaps it."""
    sbus = policy.grants("sbus:1000:42", patterns=True)
    assert sbus.allows("subscribe", "sensors/room*/")
    assert sbus.allows("subscribe", "sensors/a/x")
    # * stops at the next /: single segments below sensors/, never sensors/private/...
    assert sbus.allows("subscribe", "sensors/*")
    assert not sbus.allows("subscribe", "sensors/")  # it would get sensors/private/...
    assert not sbus.allows("subscribe", "sensors/*/x")  # sensors/private/x
    assert not sbus.allows("subscribe", "")  # everything: more than sensors/
    assert not sbus.allows("subscribe", "sens*/")  # sensible/... too
    assert sbus.allows("subscribe", "users/sbus:1000:42/")
    assert sbus.allows("subscribe", "a*b")  # matches no topic: contained in anything
    # the same texts as topics, for a protocol that subscribes to topics
    topics = policy.grants("sbus:1000:42")
    assert topics.allows("subscribe", "sensors/*/x")  # one topic, named so
    assert not topics.allows("subscribe", "sensors/private/*/")


def test_an_identity_with_a_nul_is_refused_everything():
    policy = Policy(parse_acl('pattern readwrite ""\n'))
    assert policy.grants("alice").allows("publish", "x")
    assert not policy.grants("ali\0ce").allows("publish", "x")


def test_decisions_and_grants_are_remembered_within_bounds(policy):
    alice = policy.grants("alice")
    assert policy.grants("alice") is alice
    assert policy.grants("alice", frozenset({"x"})) is not alice
    for n in range(CACHE_LIMIT + 10):
        alice.allows("publish", f"chat/{n}")
    assert len(alice._decided) <= CACHE_LIMIT
    assert alice.allows("publish", "chat/0") and not alice.allows("publish", "x")
