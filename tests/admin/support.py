"""A real broker with the admin endpoint on real sockets, and plain HTTP to it
(``http.client``): what the admin tests share."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attrs import frozen
from prometheus_client.parser import text_string_to_metric_families

from msgbroker.plugins.admin.plugin import running_admin
from msgbroker.plugins.admin.server import Admin
from tests.ssmp.e2e_support import WAIT, RawSSMP, RunningBroker, raw_login, running_broker

#: a raw SSMP client, logged in with ``open`` (tests/ssmp/e2e_support.py)
login = raw_login
Raw = RawSSMP

LISTEN = ("ssmp=tcp:0:interface=127.0.0.1",)
SECRET = "s3cret-admin"


@frozen
class AdminBroker:
    broker: RunningBroker
    admin: Admin
    port: int
    secret: str | None

    def request(
        self,
        method: str,
        path: str,
        auth: str | None = "bearer",
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request; ``auth``: "bearer", "basic" (the secret), or None."""
        sent = dict(headers or {})
        if auth == "bearer":
            sent["Authorization"] = f"Bearer {self.secret}"
        elif auth == "basic":
            token = base64.b64encode(f"admin:{self.secret}".encode()).decode()
            sent["Authorization"] = f"Basic {token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            headers = {k.lower(): v for k, v in response.getheaders()}
            return response.status, headers, response.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        status, _, body = self.request(method, path, **kwargs)
        assert status == 200, (status, body)
        return json.loads(body)

    def metrics(self) -> dict[str, list[Any]]:
        """``/metrics`` parsed by prometheus-client's parser: family name -> samples."""
        status, headers, body = self.request("GET", "/metrics", auth=None)
        assert status == 200, body
        assert headers["content-type"].startswith("text/plain")
        return {
            family.name: family.samples
            for family in text_string_to_metric_families(body.decode())
        }

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.broker.call(fn, *args)

    @contextlib.contextmanager
    def samples(self) -> Iterator[Callable[[], None]]:
        """The dashboard's event stream (``/events``) read over HTTP: yields a function that
        returns once the broker has taken its next sample (``sample_seconds`` on its clock)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        try:
            conn.request("GET", "/events", headers={"Authorization": f"Bearer {self.secret}"})
            stream = conn.getresponse()
            assert stream.status == 200

            def next_sample() -> None:
                event = ""
                while True:
                    line = stream.readline()
                    assert line, "the event stream ended"
                    if line.startswith(b"event: "):
                        event = line[7:].strip().decode()
                    elif line == b"\n" and event == "sample":
                        return

            yield next_sample
        finally:
            conn.close()

    def poll(self, check: Callable[[], Any], what: str = "", samples: int = 100) -> Any:
        """Call ``check`` after each of the broker's samples until it returns something true
        (then return that), or fail after ``samples`` of them. For what the broker samples
        on its own clock, or a scrape shows as it happens (a journal segment written)."""
        with self.samples() as next_sample:
            for _ in range(samples):
                result = check()
                if result:
                    return result
                next_sample()
        raise AssertionError(f"not after {samples} samples: {what or check}")


@contextlib.contextmanager
def admin_broker(
    tmp_path: Path,
    secret: str | None = SECRET,
    sections: dict[str, Any] | None = None,
    listeners: tuple[str, ...] = LISTEN,
    config: dict[str, Any] | None = None,
    **admin: Any,
) -> Iterator[AdminBroker]:
    """A broker in the test reactor thread with ``--admin tcp:0:interface=127.0.0.1``
    (and ``admin`` settings: fast samples by default; ``config``: more broker settings)."""
    settings: dict[str, Any] = {
        "endpoint": "tcp:0:interface=127.0.0.1",
        "sample_seconds": 0.1,
        "sys_interval": 0.1,
        **admin,
    }
    if secret is not None:
        secret_file = tmp_path / "admin.secret"
        secret_file.write_text(secret + "\n")
        settings["secret_file"] = str(secret_file)
    with running_broker(
        listeners,
        auth=("open",),
        sections={"admin": settings, **(sections or {})},
        **(config or {}),
    ) as broker:
        running = broker.call(running_admin, broker.service.broker)
        assert running is not None
        port = broker.call(lambda: running.port.getHost().port)
        yield AdminBroker(broker, running, port, secret)


def value(samples: list[Any], **labels: str) -> float | None:
    """The value of the sample with exactly these labels, or None."""
    for sample in samples:
        if sample.labels == labels:
            return sample.value
    return None
