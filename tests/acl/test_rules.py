"""The ACL file's parser (plugins/acl/rules.py): what each line means, errors that name the
line, and a fuzzer: whatever the text, the parser returns rules or raises ConfigError."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgbroker.errors import ConfigError
from msgbroker.plugins.acl.patterns import Template
from msgbroker.plugins.acl.policy import Policy
from msgbroker.plugins.acl.rules import AclRules, Rule, load_acl, parse_acl

EXAMPLE = """\
# before any user or cert line: the anonymous identity
topic write public/announcements

user alice
topic readwrite chat/
topic deny chat/admin/
topic unicast bob
topic broadcast
   topic   read   "  spaced topic  "
user sbus:1000:*
topic read sensors/
cert device-17.example.com
topic publish sensors/17/
pattern publish users/%u/
pattern deny unicast,publish %c/private
topic subscribe ""
user .
topic read public/
"""


def test_the_example():
    rules = parse_acl(EXAMPLE, "ACL file x")
    assert rules.anonymous == (
        Rule(2, False, frozenset({"publish"}), Template(("public/announcements",))),
        Rule(18, False, frozenset({"subscribe"}), Template(("public/",))),
    )
    assert rules.users["alice"] == (
        Rule(5, False, frozenset({"publish", "subscribe"}), Template(("chat/",))),
        Rule(6, True, frozenset({"publish", "subscribe"}), Template(("chat/admin/",))),
        Rule(7, False, frozenset({"unicast"}), Template(("bob",))),
        Rule(8, False, frozenset({"broadcast"}), None),
        Rule(9, False, frozenset({"subscribe"}), Template(("  spaced topic  ",))),
    )
    assert rules.user_prefixes == {
        "sbus:1000:": (Rule(11, False, frozenset({"subscribe"}), Template(("sensors/",))),)
    }
    assert rules.certs["device-17.example.com"] == (
        Rule(13, False, frozenset({"publish"}), Template(("sensors/17/",))),
        Rule(16, False, frozenset({"subscribe"}), Template(())),
    )
    assert rules.patterns == (
        Rule(14, False, frozenset({"publish"}), Template(("users/", None, "/"))),
        Rule(15, True, frozenset({"unicast", "publish"}), Template((None, "/private"))),
    )
    assert rules.count == 12
    assert rules.source == "ACL file x"


def test_an_empty_file_has_no_rules():
    assert parse_acl("") == AclRules("ACL")
    assert parse_acl("# nothing\n\n   \n").count == 0


def test_topic_lines_take_the_rest_of_the_line_and_tabs_separate():
    rules = parse_acl("user\talice\ntopic\tpublish\ta topic with spaces\t\r\n")
    assert rules.users["alice"][0].template == Template(("a topic with spaces",))


def test_a_topic_line_without_access_is_readwrite_and_deny_without_access_too():
    rules = parse_acl("topic news\ntopic deny news/secret\n")
    assert rules.anonymous[0].actions == {"publish", "subscribe"}
    assert rules.anonymous[1].deny and rules.anonymous[1].actions == {"publish", "subscribe"}


def test_a_word_that_is_no_access_is_the_topic():
    assert parse_acl("topic news today").anonymous[0].template == Template(("news today",))


def test_percent_u_is_literal_in_topic_lines():
    assert parse_acl("topic users/%u").anonymous[0].template == Template(("users/%u",))


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("topic", 1, "the topic is missing"),
        ("\n\ntopic read", 3, "the topic is missing"),
        ("topic deny", 1, "the topic is missing"),
        ("user", 1, "user needs a name"),
        ("cert", 1, "cert needs a name"),
        ("users alice", 1, "unknown keyword 'users'"),
        ("topic read,writ x", 1, "unknown access 'writ'"),
        ("topic broadcast x", 1, "broadcast takes no topic"),
        ("topic publish,broadcast x", 1, "broadcast has no topic"),
        ("topic a*b", 1, "matches no topic"),
        ("topic x/**", 1, "matches no topic"),
        ("pattern publish a*%u", 1, "matches no topic"),
        ('topic "unterminated', 1, "not a JSON string"),
        ("topic 5", 1, None),  # a topic, not an error
        ('topic "\\udc80"', 1, "not text"),
        ('user ["alice"]', 1, None),
        ('user "x', 1, "not a JSON string"),
    ],
)
def test_errors_name_the_line(text, line, message):
    if message is None:
        parse_acl(text)
        return
    with pytest.raises(ConfigError) as raised:
        parse_acl(text, "ACL file /etc/acl")
    assert str(raised.value).startswith(f"ACL file /etc/acl line {line}: ")
    assert message in str(raised.value)


def test_load_acl_reads_a_file(tmp_path):
    path = tmp_path / "acl"
    path.write_text("user alice\ntopic chat/\n")
    rules = load_acl(str(path))
    assert rules.source == f"ACL file {path}"
    assert rules.users["alice"][0].line == 2


def test_load_acl_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the ACL file .*missing"):
        load_acl(str(tmp_path / "missing"))
    path = tmp_path / "latin1"
    path.write_bytes(b"user alice\ntopic caf\xe9\n")
    with pytest.raises(ConfigError, match=r"ACL file .*latin1 line 2: not UTF-8 text"):
        load_acl(str(path))


# -- fuzzing -----------------------------------------------------------------------------------

WORDS = ["user", "cert", "topic", "pattern", "deny", "read", "write", "readwrite", "publish",
         "subscribe", "unicast", "broadcast", "read,write", "unicast,publish", "%u", "%c",
         "*", "a*", "a*b", "**", "/", "a/", "a/*/b/", '""', '"x y"', '"\\ud800"', "#", ".",
         "alice", "sbus:1:*", "\t", " ", "é", "\x00", '"', "\\", ","]  # fmt: skip
LINES = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINES, max_size=12).map("\n".join))
def test_fuzz_grammar_like_text_parses_or_is_a_config_error(text):
    _parse_and_compile(text)


@settings(max_examples=300)
@given(st.text(max_size=300))
def test_fuzz_any_text_parses_or_is_a_config_error(text):
    _parse_and_compile(text)


def _parse_and_compile(text: str) -> None:
    try:
        rules = parse_acl(text)
    except ConfigError as e:
        error = str(e)
    else:
        error = None
    if error is not None:
        assert error.startswith("ACL line ")
        return
    policy = Policy(rules)  # whatever parsed compiles, and decides
    grants = policy.grants("alice", frozenset({"alice.example"}))
    for action, topic in (("publish", "a/b"), ("subscribe", ""), ("broadcast", None)):
        assert grants.allows(action, topic) in (True, False)
    assert policy.grants("sbus:1:2", None, patterns=True).allows("subscribe", "a*/") in (
        True,
        False,
    )
