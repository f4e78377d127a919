"""The hot-path hooks as the broker binds them (``Plugins.bind``): one implementation is
called directly, several through pluggy, with the same answers; and ``per_topic``, which
tells the protocols an authorization hook decides per (session, action, topic)."""

from __future__ import annotations

from msgbroker import Broker, BrokerConfig, hookimpl, per_topic
from msgbroker.testing import connect, make_broker


class PerTopic:
    @hookimpl
    @per_topic
    def msgbroker_authorize(self, session, action, topic):
        return topic != "no"


class PerRequest:
    @hookimpl
    def msgbroker_authorize(self, session, action, topic):
        return None


class TopicOnly:
    """Takes a subset of the hook's arguments, as pluggy allows."""

    @hookimpl
    def msgbroker_authorize(self, topic):
        return topic != "no"


def broker_with(*plugins):
    return make_broker(BrokerConfig(auth=("open",)), plugins=plugins)


def session_of(broker):
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN a open\n")
    assert conn.received() == b"200\n"
    return conn.session


def test_without_an_implementation_nothing_is_bound():
    broker = broker_with()
    assert not broker.authorizes and not broker.authorizes_per_topic
    assert broker.plugins.bind().authorize is None


def test_one_implementation_is_bound_to_itself():
    plugin = PerTopic()
    broker = broker_with(plugin)
    assert broker.plugins.bind().authorize == plugin.msgbroker_authorize
    session = session_of(broker)
    assert broker.authorize(session, "publish", "yes")
    assert not broker.authorize(session, "publish", "no")


def test_an_implementation_of_some_arguments_gets_those():
    broker = broker_with(TopicOnly())
    session = session_of(broker)
    assert broker.authorize(session, "publish", "yes")
    assert not broker.authorize(session, "publish", "no")


def test_several_implementations_go_through_pluggy_first_result_first():
    broker = broker_with(PerTopic(), PerRequest())  # PerRequest, later, is asked first
    session = session_of(broker)
    assert not broker.authorize(session, "publish", "no")  # it abstains, PerTopic refuses
    assert broker.authorize(session, "publish", "yes")


def test_per_topic_only_when_every_implementation_says_so():
    assert broker_with(PerTopic()).authorizes_per_topic
    assert not broker_with(PerRequest()).authorizes_per_topic
    assert not broker_with(PerTopic(), PerRequest()).authorizes_per_topic
    assert broker_with(PerTopic(), PerTopic()).authorizes_per_topic


def test_a_subclass_hook_is_per_request():
    class Guarded(Broker):
        def msgbroker_authorize(self, session, action, topic):
            return topic != "no"

    broker = make_broker(BrokerConfig(auth=("open",)), broker_class=Guarded)
    assert broker.authorizes and not broker.authorizes_per_topic


def test_adding_and_removing_a_plugin_binds_again():
    broker = broker_with()
    generation = broker.hub.generation
    broker.add_plugin(PerTopic(), name="guard")
    assert broker.authorizes_per_topic and broker.hub.generation > generation
    broker.add_plugin(PerRequest(), name="other")
    assert broker.authorizes and not broker.authorizes_per_topic
    broker.remove_plugin(name="other")
    broker.remove_plugin(name="guard")
    assert not broker.authorizes and not broker.authorizes_per_topic


class Observer:
    def __init__(self):
        self.seen = []

    @hookimpl
    def msgbroker_message_routed(self, message, result):
        self.seen.append((message.topic, result.delivered))


def test_a_single_observer_is_called_directly_and_sees_each_message():
    observer = Observer()
    broker = broker_with(observer)
    assert broker.plugins.bind().message_routed == observer.msgbroker_message_routed
    conn = connect(broker, "ssmp")
    conn.send(b"LOGIN a open\nMCAST t 1\nMCAST t 2\n")
    assert conn.received() == b"200\n200\n200\n"
    assert observer.seen == [("t", 0), ("t", 0)]
