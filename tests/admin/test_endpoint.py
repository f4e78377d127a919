"""The admin endpoint of a real broker over real sockets: ``/metrics`` parsed by
prometheus-client's parser, the API's credential, kicking a session end to end, the
``_sys`` topics and the dashboard's event stream."""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from attrs import evolve

from msgbroker import ConfigError
from tests.admin.support import admin_broker, login, value
from tests.ssmp.e2e_support import WAIT


def test_metrics_parse_and_show_a_publish(tmp_path):
    with admin_broker(tmp_path) as ab:
        reader = login(ab.broker, "reader")
        reader.request(b"SUBSCRIBE news\n")
        writer = login(ab.broker, "writer")
        writer.request(b"MCAST news one\nMCAST news two\nMCAST news three\n", b"200\n200\n200\n")
        for word in (b"one", b"two", b"three"):
            assert reader.line() == b"000 writer MCAST news " + word + b"\n"

        def published():
            metrics = ab.metrics()
            if value(metrics["msgbroker_topic_messages"], topic="news") == 3:
                return metrics
            return None

        metrics = ab.poll(published, what="news ranked with its 3 messages")
        assert value(metrics["msgbroker_messages_received"], protocol="ssmp") == 3
        assert value(metrics["msgbroker_frames_sent"], protocol="ssmp") >= 1
        assert value(metrics["msgbroker_connections"], protocol="ssmp") == 2
        assert value(metrics["msgbroker_connections"], protocol="stmp") == 0
        assert value(metrics["msgbroker_logins"]) == 2
        assert value(metrics["msgbroker_topic_subscribers"], topic="news") == 1
        assert value(metrics["msgbroker_bytes_received"], protocol="ssmp") > 0
        assert value(metrics["msgbroker_bytes_sent"], protocol="ssmp") > 0
        assert value(metrics["msgbroker_deliveries"]) >= 3
        assert "msgbroker_journal_segments" not in metrics  # no journal: nothing of it
        assert all(name.startswith("msgbroker_") for name in metrics)
        # the process collector, under the broker's namespace
        assert value(metrics["msgbroker_process_resident_memory_bytes"]) > 0
        reader.close()
        writer.close()


def test_login_failures_and_closes_are_counted(tmp_path):
    with admin_broker(tmp_path, listeners=("ssmp=tcp:0:interface=127.0.0.1",)) as ab:
        client = login(ab.broker, "bye")
        client.request(b"CLOSE\n")
        assert client.eof()
        def closed():
            metrics = ab.metrics()
            if value(metrics["msgbroker_connections_closed"], reason="close requested"):
                return metrics
            return None

        metrics = ab.poll(closed)
        assert value(metrics["msgbroker_connections_opened"], protocol="ssmp") == 1
        assert value(metrics["msgbroker_login_failures"]) == 0


def test_the_api_wants_the_credential(tmp_path):
    with admin_broker(tmp_path) as ab:
        for path in ("/api/info", "/api/sessions", "/", "/events"):
            status, headers, body = ab.request("GET", path, auth=None)
            assert status == 401, path
            assert headers["www-authenticate"].startswith("Basic realm=")
            assert json.loads(body) == {"error": "the admin credential is required"}
        status, _, _ = ab.request(
            "GET", "/api/info", auth=None, headers={"Authorization": "Bearer wrong"}
        )
        assert status == 401
        status, _, _ = ab.request(
            "GET", "/api/info", auth=None, headers={"Authorization": "Basic !!notbase64"}
        )
        assert status == 401
        for auth in ("bearer", "basic"):
            info = ab.json("GET", "/api/info", auth=auth)
            assert info["version"]
        # metrics need no credential unless asked for
        assert ab.request("GET", "/metrics", auth=None)[0] == 200
        # a page of another origin cannot use a browser's remembered credential to kick
        status, _, _ = ab.request(
            "POST", "/api/sessions/1/kick", headers={"Origin": "http://evil.example"}
        )
        assert status == 403


def test_without_a_secret_file_only_metrics_are_served(tmp_path):
    with admin_broker(tmp_path, secret=None) as ab:
        status, _, body = ab.request("GET", "/api/info", auth=None)
        assert status == 403
        assert b"--admin-secret-file" in body
        assert ab.request("GET", "/", auth=None)[0] == 403
        assert ab.request("GET", "/metrics", auth=None)[0] == 200


def test_metrics_can_want_the_credential_too(tmp_path):
    with admin_broker(tmp_path, metrics_auth=True) as ab:
        assert ab.request("GET", "/metrics", auth=None)[0] == 401
        assert ab.request("GET", "/metrics")[0] == 200


def test_info_lists_listeners_and_plugins(tmp_path):
    with admin_broker(tmp_path) as ab:
        info = ab.json("GET", "/api/info")
        assert [(entry["protocol"], entry["address"]) for entry in info["listeners"]] == [
            ("ssmp", f"tcp:127.0.0.1:{ab.broker.port}")
        ]
        assert {"ssmp", "admin", "journal"} <= set(info["plugins"])
        assert info["admin"]["address"] == f"tcp:127.0.0.1:{ab.port}"
        assert info["uptime"] >= 0
        # no --node-name: the host name and the port the first listener was given (tcp:0)
        assert info["node"] == f"{socket.gethostname()}:{ab.broker.port}"
        assert value(ab.metrics()["msgbroker_info"], version=ab.admin.version, node=info["node"])


def test_the_node_name_is_in_the_info_the_metrics_and_a_sys_topic(tmp_path):
    with admin_broker(tmp_path, config={"node_name": "east-1"}) as ab:
        assert ab.json("GET", "/api/info")["node"] == "east-1"
        assert value(ab.metrics()["msgbroker_info"], version=ab.admin.version, node="east-1")
        watcher = login(ab.broker, "watcher")
        watcher.request(b"SUBSCRIBE _sys/broker/node\n", b"200\n")
        assert watcher.line() == b"000 _sys MCAST _sys/broker/node east-1\n"


def test_sessions_are_listed_and_kicked_end_to_end(tmp_path):
    with admin_broker(tmp_path) as ab:
        victim = login(ab.broker, "victim")
        victim.request(b"SUBSCRIBE t\nMCAST t x\n", b"200\n200\n")
        sessions = ab.json("GET", "/api/sessions")["sessions"]
        (entry,) = [s for s in sessions if s["identity"] == "victim"]
        assert entry["protocol"] == "ssmp"
        assert entry["address"] == "127.0.0.1"
        assert entry["messages_in"] == 1
        assert entry["bytes_in"] == len(b"LOGIN victim open\nSUBSCRIBE t\nMCAST t x\n")
        assert entry["bytes_out"] == len(b"200\n200\n200\n")
        assert entry["subscriptions"] == 1
        assert entry["since"].endswith("+00:00")
        one = ab.json("GET", f"/api/sessions/{entry['id']}")
        assert one["identity"] == "victim"

        kicked = ab.json("POST", f"/api/sessions/{entry['id']}/kick")
        assert kicked["kicked"]["identity"] == "victim"
        assert victim.eof()  # the broker closed the connection
        status, _, _ = ab.request("GET", f"/api/sessions/{entry['id']}")
        assert status == 404
        assert ab.request("POST", f"/api/sessions/{entry['id']}/kick")[0] == 404
        assert ab.request("DELETE", "/api/sessions/nonsense")[0] == 404
        metrics = ab.metrics()
        assert value(metrics["msgbroker_connections_closed"], reason="kicked") == 1
        victim.close()


def test_delete_kicks_too(tmp_path):
    with admin_broker(tmp_path) as ab:
        victim = login(ab.broker, "victim")
        (entry,) = ab.json("GET", "/api/sessions")["sessions"]
        assert ab.request("DELETE", f"/api/sessions/{entry['id']}")[0] == 200
        assert victim.eof()
        victim.close()


def test_topics_are_listed_with_subscribers(tmp_path):
    with admin_broker(tmp_path) as ab:
        a = login(ab.broker, "a")
        b = login(ab.broker, "b")
        a.request(b"SUBSCRIBE red\nSUBSCRIBE blue\n", b"200\n200\n")
        b.request(b"SUBSCRIBE red\nMCAST red hi\n", b"200\n200\n")
        listed = ab.json("GET", "/api/topics")
        by_name = {t["topic"]: t for t in listed["topics"]}
        assert listed["count"] == 2
        assert by_name["red"]["subscribers"] == 2
        assert by_name["red"]["published"] == 1
        assert by_name["blue"]["subscribers"] == 1
        only = ab.json("GET", "/api/topics?prefix=bl&limit=5")["topics"]
        assert [t["topic"] for t in only] == ["blue"]
        assert ab.request("GET", "/api/topics?limit=x")[0] == 400
        a.close()
        b.close()


def test_sys_topics_are_published_and_never_ranked(tmp_path):
    with admin_broker(tmp_path, top_topics=5) as ab:
        watcher = login(ab.broker, "watcher")
        watcher.request(
            b"SUBSCRIBE _sys/broker/connections\nSUBSCRIBE _sys/broker/version\n", b"200\n200\n"
        )
        seen = {}
        # a value comes from the latest sample, which may be from before the watcher came
        while not (seen.get("_sys/broker/connections") == "1" and len(seen) == 2):
            line = watcher.line().decode()
            _, sender, verb, topic, payload = line.rstrip("\n").split(" ", 4)
            assert (sender, verb) == ("_sys", "MCAST")
            seen[topic] = payload
        assert seen["_sys/broker/version"] == ab.admin.version

        def sys_counted():
            metrics = ab.metrics()
            return metrics if value(metrics["msgbroker_sys_messages"]) else None

        metrics = ab.poll(sys_counted)
        ranked = metrics["msgbroker_topic_messages"]
        assert not any(s.labels["topic"].startswith("_sys/") for s in ranked)
        # they are nobody's messages: no protocol received them
        assert value(metrics["msgbroker_messages_received"], protocol="ssmp") == 0
        assert value(metrics["msgbroker_topic_rank_size"]) == 5
        watcher.close()


def test_the_event_stream_sends_history_then_samples(tmp_path):
    with admin_broker(tmp_path) as ab:
        conn = http.client.HTTPConnection("127.0.0.1", ab.port, timeout=WAIT)
        conn.request("GET", "/events", headers={"Authorization": f"Bearer {ab.secret}"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type").startswith("text/event-stream")
        events = []
        name = None
        while len(events) < 3:
            line = response.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: "):])))
        assert events[0][0] == "history"
        assert isinstance(events[0][1], list) and events[0][1]
        assert [e[0] for e in events[1:]] == ["sample", "sample"]
        sample = events[2][1]
        assert {"connections", "rates", "topics", "slow", "totals"} <= set(sample)
        assert events[2][1]["at"] > events[1][1]["at"]
        conn.close()


def test_unknown_paths_are_404(tmp_path):
    with admin_broker(tmp_path) as ab:
        assert ab.request("GET", "/nothing")[0] == 404
        assert ab.request("GET", "/api/nothing")[0] == 404
        assert ab.request("GET", "/static/nothing.js")[0] == 404
        status, headers, body = ab.request("GET", "/static/dashboard.js", auth=None)
        assert status == 200 and b"EventSource" in body
        assert headers["content-type"].startswith("text/javascript")


def test_a_reload_reads_the_credential_again_and_refuses_an_empty_one(tmp_path):
    with admin_broker(tmp_path) as ab:
        broker = ab.broker.service.broker
        secret_file = tmp_path / "admin.secret"

        def reload_with(**admin: object) -> None:
            sections = dict(broker.config.sections)
            sections["admin"] = {**sections["admin"], **admin}
            ab.call(broker.reload, evolve(broker.config, sections=sections))

        secret_file.write_text("\n")
        with pytest.raises(ConfigError, match=r"admin secret file .* is empty"):
            reload_with(metrics_auth=True)
        assert ab.request("GET", "/api/info")[0] == 200  # the old credential stays
        assert ab.request("GET", "/metrics", auth=None)[0] == 200  # and the old settings

        secret_file.write_text("the-new-one\n")
        reload_with(metrics_auth=True, top_topics=3)
        new = {"Authorization": "Bearer the-new-one"}
        assert ab.request("GET", "/api/info")[0] == 401  # the old credential no longer
        info = json.loads(ab.request("GET", "/api/info", auth=None, headers=new)[2])
        assert info["admin"]["top_topics"] == 3
        assert ab.request("GET", "/metrics", auth=None)[0] == 401
        assert ab.request("GET", "/metrics", auth=None, headers=new)[0] == 200


def test_a_running_admin_endpoint_adds_nothing_to_the_per_message_path(tmp_path):
    """What it shows comes from counters the broker keeps anyway: with the endpoint
    running (and scraped), no hook is called per message or per request."""
    with admin_broker(tmp_path) as ab:
        broker = ab.broker.service.broker
        ab.metrics()
        hooks = ab.call(broker.plugins.bind)
        assert hooks.message_routed is None
        assert hooks.run_routed is None
        assert hooks.authorize is None
        assert broker.hub.observer is None and broker.hub.run_observer is None
