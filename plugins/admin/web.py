"""The admin endpoint's web site (twisted.web): who may see what, and the resources that
are not the JSON API (:mod:`.api`): the dashboard page and its files, ``/metrics`` and the
dashboard's event stream (server-sent events, ``/events``).

The admin credential is the secret file's first line, given as HTTP basic authentication
(any user name, the secret as the password: what a browser asks for) or as
``Authorization: Bearer SECRET``; it is compared in constant time. Without a credential
configured, the API, the dashboard and the event stream answer 403: only ``/metrics``
works. A request that changes something (POST, DELETE) from a web page of another origin
is refused, so a page elsewhere cannot use the browser's remembered credential.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from .api import Api, json_response
from .metrics import CONTENT_TYPE_LATEST, exposition

if TYPE_CHECKING:
    from .sampler import Sample
    from .server import Admin

#: the dashboard's files (in the package's ``static`` directory) and their types
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

REALM = b'Basic realm="msgbroker admin", charset="UTF-8"'


def credential_of(request: Any) -> bytes | None:
    """The secret a request presents (basic: the password; bearer: the token), or None."""
    header = request.getHeader(b"authorization")
    if not header:
        return None
    scheme, _, value = header.strip().partition(b" ")
    scheme = scheme.lower()
    if scheme == b"bearer":
        return value.strip()
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        _user, colon, password = decoded.partition(b":")
        return password if colon else None
    return None


def authorized(request: Any, secret: bytes) -> bool:
    given = credential_of(request)
    return given is not None and hmac.compare_digest(given, secret)


def same_origin(request: Any) -> bool:
    """Whether a request comes from no web page, or from one of this very endpoint."""
    origin = request.getHeader(b"origin")
    if origin is None:
        return True
    host = request.getHeader(b"host") or b""
    return urlsplit(origin.decode("latin-1")).netloc.encode("latin-1") == host


class Refusal(Resource):
    """401 (asking for the credential) or 403, as JSON."""

    isLeaf = True

    def __init__(self, code: int, text: str) -> None:
        super().__init__()
        self.code = code
        self.text = text

    def render(self, request: Any) -> bytes:
        if self.code == 401:
            request.setHeader(b"www-authenticate", REALM)
        return json_response(request, {"error": self.text}, self.code)


class Root(Resource):
    """``/``: the dashboard; ``/static/...``, ``/metrics``, ``/events``, ``/api/...``."""

    def __init__(self, admin: Admin) -> None:
        super().__init__()
        self.admin = admin
        self.static = Static()
        self.metrics = Metrics(admin)
        self.events = EventStream(admin)
        self.api = Api(admin)

    def getChild(self, path: bytes, request: Any) -> Resource:
        if path == b"static":
            return self.static
        if path == b"metrics":
            if self.admin.settings.metrics_auth:
                return self._guarded(self.metrics, request)
            return self.metrics
        if path in (b"", b"index.html"):
            return self._guarded(self.static.page("index.html"), request)
        if path == b"events":
            return self._guarded(self.events, request)
        if path == b"api":
            return self._guarded(self.api, request)
        return Refusal(404, "not found")

    def _guarded(self, resource: Resource, request: Any) -> Resource:
        secret = self.admin.secret
        if secret is None:
            return Refusal(403, "no admin credential is configured (--admin-secret-file)")
        if not authorized(request, secret):
            return Refusal(401, "the admin credential is required")
        if request.method not in (b"GET", b"HEAD") and not same_origin(request):
            return Refusal(403, "refused: the request comes from another origin")
        return resource


class Page(Resource):
    isLeaf = True

    def __init__(self, body: bytes, content_type: str) -> None:
        super().__init__()
        self.body = body
        self.content_type = content_type.encode()

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", self.content_type)
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-content-type-options", b"nosniff")
        return self.body


class Static(Resource):
    """The dashboard's files, read once from the package."""

    def __init__(self) -> None:
        super().__init__()
        here = resources.files(__package__) / "static"
        self.pages = {
            name: Page((here / name).read_bytes(), kind) for name, kind in STATIC.items()
        }

    def page(self, name: str) -> Resource:
        return self.pages[name]

    def getChild(self, path: bytes, request: Any) -> Resource:
        page = self.pages.get(path.decode("utf-8", "replace"))
        return page if page is not None else Refusal(404, "not found")


class Metrics(Resource):
    """``/metrics``: the Prometheus text format, collected now."""

    isLeaf = True

    def __init__(self, admin: Admin) -> None:
        super().__init__()
        self.admin = admin

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return exposition(self.admin.registry)


class EventStream(Resource):
    """``/events``: server-sent events for the dashboard. A new reader first gets the
    recent samples (``event: history``), then one ``sample`` event per sample."""

    isLeaf = True

    def __init__(self, admin: Admin) -> None:
        super().__init__()
        self.admin = admin
        self.readers: set[Any] = set()

    def render_GET(self, request: Any) -> Any:
        request.setHeader(b"content-type", b"text/event-stream; charset=utf-8")
        request.setHeader(b"cache-control", b"no-cache")
        request.setHeader(b"x-accel-buffering", b"no")
        history = [s.as_json() for s in self.admin.sampler.history]
        request.write(b"retry: 2000\n\n" + _event("history", history))
        self.readers.add(request)
        request.notifyFinish().addBoth(lambda _: self.readers.discard(request))
        return NOT_DONE_YET

    def send(self, sample: Sample) -> None:
        if not self.readers:
            return
        data = _event("sample", sample.as_json())
        for request in list(self.readers):
            request.write(data)

    def close_all(self) -> None:
        for request in list(self.readers):
            self.readers.discard(request)
            request.finish()


def _event(name: str, body: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()
