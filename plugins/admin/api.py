"""The JSON admin API under ``/api`` (twisted.web): broker info, sessions (list, one, kick)
and topics. Every request is authorized by :mod:`.web` before it gets here.

=======  ===============================  ==========================================
method   path                             answer
=======  ===============================  ==========================================
GET      /api/info                        version, uptime, listeners, plugins, admin
GET      /api/sessions                    every open session
GET      /api/sessions/ID                 one session (404 when it is gone)
POST     /api/sessions/ID/kick            close it (``kicked: by the admin API``)
DELETE   /api/sessions/ID                 the same
GET      /api/topics?limit=N&prefix=P     topics, busiest first, with subscribers
=======  ===============================  ==========================================
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any

from twisted.web.resource import Resource

if TYPE_CHECKING:
    from msgbroker.session import Session

    from .server import Admin

#: the detail a session kicked through the API is closed with (its close text:
#: ``kicked: by the admin API``)
KICK_DETAIL = "by the admin API"


def json_response(request: Any, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body, indent=1).encode() + b"\n"


def session_json(session: Session) -> dict[str, Any]:
    """What the API says of one session."""
    output = session.output
    return {
        "id": session.id,
        "identity": session.identity,
        "protocol": session.protocol,
        "address": session.host,
        "since": datetime.datetime.fromtimestamp(session.opened_at, datetime.UTC).isoformat(),
        "bytes_in": session.bytes_in,
        "bytes_out": session.bytes_out,
        "messages_in": session.messages_in,
        "frames_out": session.frames_out,
        "backlog": output.measure() if output is not None else 0,
        "dropped": session.dropped,
        "subscriptions": len(session.subscriptions),
        "tls_names": sorted(session.tls_names) if session.tls_names else None,
    }


class Api(Resource):
    """``/api``: each path is answered by a method below."""

    isLeaf = True

    def __init__(self, admin: Admin) -> None:
        super().__init__()
        self.admin = admin

    def render_GET(self, request: Any) -> bytes:
        path = _path(request)
        if path == ["info"]:
            return json_response(request, self.admin.info())
        if path == ["sessions"]:
            sessions = [session_json(s) for s in self.admin.broker.sessions]
            return json_response(request, {"sessions": sessions})
        if len(path) == 2 and path[0] == "sessions":
            session = self._session(path[1])
            if session is None:
                return json_response(request, {"error": "no such session"}, 404)
            return json_response(request, session_json(session))
        if path == ["topics"]:
            return self._topics(request)
        return json_response(request, {"error": "not found"}, 404)

    def render_POST(self, request: Any) -> bytes:
        path = _path(request)
        if len(path) == 3 and path[0] == "sessions" and path[2] == "kick":
            return self._kick(request, path[1])
        return json_response(request, {"error": "not found"}, 404)

    def render_DELETE(self, request: Any) -> bytes:
        path = _path(request)
        if len(path) == 2 and path[0] == "sessions":
            return self._kick(request, path[1])
        return json_response(request, {"error": "not found"}, 404)

    def _session(self, text: str) -> Session | None:
        try:
            wanted = int(text)
        except ValueError:
            return None
        for session in self.admin.broker.sessions:
            if session.id == wanted:
                return session
        return None

    def _kick(self, request: Any, text: str) -> bytes:
        session = self._session(text)
        if session is None:
            return json_response(request, {"error": "no such session"}, 404)
        body = session_json(session)
        self.admin.kick(session)
        return json_response(request, {"kicked": body})

    def _topics(self, request: Any) -> bytes:
        args = request.args
        try:
            limit = int(args.get(b"limit", [b"1000"])[0])
        except ValueError:
            return json_response(request, {"error": "limit must be a whole number"}, 400)
        prefix = args.get(b"prefix", [b""])[0].decode("utf-8", "replace")
        topics = self.admin.broker.hub.topics
        rates = self.admin.sampler.topic_rates
        chosen = [
            (rates.get(name, 0.0), name, topic)
            for name, topic in topics.items()
            if name.startswith(prefix)
        ]
        chosen.sort(key=lambda item: (-item[0], item[1]))
        listed = [
            {
                "topic": name,
                "subscribers": len(topic.members),
                "published": topic.published,
                "rate": rate,
            }
            for rate, name, topic in chosen[: max(0, limit)]
        ]
        return json_response(request, {"count": len(topics), "topics": listed})


def _path(request: Any) -> list[str]:
    """The path below ``/api``, as text segments (no empty ones)."""
    return [p.decode("utf-8", "replace") for p in request.postpath if p]

