"""The ACL plugin: ``--acl FILE`` (``[acl] file``) allows each session only what the file
says, on every protocol (docs/operations.md, "Access control").

Hot-path rule: this module implements only the configuration, lifecycle and reload hooks,
so a broker without an ACL file has no ``msgbroker_authorize`` implementation and its
protocols ask nothing per request (and keep their fast paths). With a file, the started
hook loads it (a bad file stops the broker) and registers an :class:`AccessControl` with
``broker.add_plugin``; a reload loads the new file first and, only when every plugin has
accepted its part, puts it in place (or adds, or removes, the access control). No session
can open before the started hook runs: listeners accept connections only once the reactor
turns, after the service has started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from msgbroker import hookimpl, per_topic
from msgbroker.errors import NotAllowed, NotSubscribed

from .policy import PATTERN_SUBSCRIBERS, Grants, Policy
from .rules import load_acl
from .settings import SECTION, acl_settings

if TYPE_CHECKING:
    from twisted.logger import Logger

    from msgbroker import BrokerConfig, ConfigSection
    from msgbroker.broker import Broker
    from msgbroker.session import Session


def _log() -> Logger:
    """The plugin's logger, made on first use: the ``msgbroker`` command line imports this
    module (for its commands) and must not import Twisted."""
    from twisted.logger import Logger

    return Logger(namespace="msgbroker.acl")


#: the name the access control is registered under among the broker's plugins
ACTIVE = "acl.active"
#: the ``session.data`` key of a session's :class:`~.policy.Grants`
SESSION_KEY = "acl"


class AccessControl:
    """``msgbroker_authorize`` for a loaded ACL: refuses (``False``) what the policy does
    not allow, and abstains (``None``) otherwise, so another plugin may still refuse.

    The answer depends on the session (its identity, certificate names and protocol), the
    action and the topic only, so the hook is marked :func:`~msgbroker.per_topic`: the
    protocols keep their runs of pipelined publishes (one answer per run) and sbus its
    route cache. A new policy comes with a new :class:`AccessControl` (see the reload
    hook), which moves the hub's generation and so forgets what was remembered."""

    def __init__(self, broker: Broker, policy: Policy) -> None:
        self.broker = broker
        self.policy = policy

    @hookimpl(tryfirst=True)
    @per_topic
    def msgbroker_authorize(self, session: Session, action: str, topic: str | None) -> bool | None:
        grants = session.data.get(SESSION_KEY)
        if grants is None or grants.policy is not self.policy:
            grants = session.data[SESSION_KEY] = grants_of(self.policy, session)
        if grants.allows(action, topic):
            return None
        broker = self.broker
        broker.rate_limited_log(
            "acl-refused",
            broker.reactor.seconds(),
            f"ACL refused {session.protocol} {session.identity or '-'} "
            f"({session.host or 'local'}): {action} {topic!r}",
        )
        return False


def grants_of(policy: Policy, session: Session) -> Grants:
    """What ``session`` may do under ``policy`` (it has logged in)."""
    return policy.grants(
        session.identity or "", session.tls_names, session.protocol in PATTERN_SUBSCRIBERS
    )


def active_acl(broker: Broker) -> AccessControl | None:
    """The broker's access control, or ``None`` (no ACL file, or not started)."""
    active = broker.plugins.get(ACTIVE)
    return active if isinstance(active, AccessControl) else None


def load_policy(path: str) -> Policy:
    """Read, parse and compile the ACL file (``ConfigError`` when it is bad)."""
    return Policy(load_acl(path))


def revoke(broker: Broker, policy: Policy) -> int:
    """Drop the subscriptions ``policy`` does not allow (the rules changed under them, as
    Mosquitto's existing subscriptions follow a reloaded ACL); returns how many."""
    hub, dropped = broker.hub, 0
    for session in list(broker.sessions):
        if session.identity is None:
            continue
        grants = grants_of(policy, session)
        for topic in list(session.subscriptions):
            if not grants.allows("subscribe", topic):
                try:
                    hub.unsubscribe(session, topic)
                except (NotSubscribed, NotAllowed):  # not held after all
                    continue
                dropped += 1
        for pattern in dict.fromkeys(hub.patterns.patterns_of(session)):
            if not grants.allows("subscribe", pattern):
                while hub.unsubscribe_pattern(session, pattern):  # every copy of it
                    dropped += 1
    broker.batcher.flush()  # the presence events of what was dropped
    return dropped


def _describe(policy: Policy) -> str:
    rules = policy.rules
    return (
        f"{_count(rules.count, 'rule')} from {rules.source.removeprefix('ACL file ')} "
        f"({_count(len(rules.users) + len(rules.user_prefixes), 'user')}, "
        f"{_count(len(rules.certs), 'certificate name')}, "
        f"{_count(len(rules.patterns), 'pattern')})"
    )


def _count(number: int, what: str) -> str:
    return f"{number} {what}" if number == 1 else f"{number} {what}s"


@hookimpl
def msgbroker_register_config_sections(register: Callable[[ConfigSection[Any]], None]) -> None:
    register(SECTION)


@hookimpl
def msgbroker_broker_started(broker: Broker) -> None:
    path = acl_settings(broker.config).file
    if not path or active_acl(broker) is not None:
        return
    policy = load_policy(path)  # a bad file stops the broker (ConfigError)
    broker.add_plugin(AccessControl(broker, policy), name=ACTIVE)  # authorize is bound now
    _log().info("ACL: {what}", what=_describe(policy))


@hookimpl
def msgbroker_reload(broker: Broker, config: BrokerConfig) -> Callable[[], None] | None:
    path = acl_settings(config).file
    active = active_acl(broker)
    if not path:
        if active is None:
            return None

        def remove() -> None:
            broker.remove_plugin(name=ACTIVE)
            _log().info("ACL removed: everything is allowed")

        return remove
    policy = load_policy(path)  # a bad file refuses the reload; the old rules stay

    def put_in_place() -> None:
        if active is not None:  # a new one: what the protocols remembered goes with it
            broker.remove_plugin(name=ACTIVE)
        broker.add_plugin(AccessControl(broker, policy), name=ACTIVE)
        dropped = revoke(broker, policy)
        _log().info(
            "ACL reloaded: {what}{dropped}",
            what=_describe(policy),
            dropped=f"; {dropped} subscriptions it refuses were dropped" if dropped else "",
        )

    return put_in_place


@hookimpl
def msgbroker_broker_stopped(broker: Broker) -> None:
    if active_acl(broker) is not None:
        broker.remove_plugin(name=ACTIVE)
