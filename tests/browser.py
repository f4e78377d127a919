"""A real headless Chromium, Debian's (``/usr/bin/chromium``, which scripts/setup installs
for the test extra), driven by playwright; no ``playwright install`` and no browser
download. A test takes the fixture ``browser`` (import it into the test module, or a
conftest, with ``from tests.browser import browser``) and calls it with a URL::

    def test_page(browser):
        page = browser("http://127.0.0.1:8090/", http_credentials={"username": "a",
                                                                   "password": "b"})
        page.wait_for_selector("#status.on")
        docs_screenshot(page, "page.png", tmp_path)

Each call starts a browser of its own with a fresh user-data directory (keyword arguments
go to playwright's ``launch_persistent_context``: ``http_credentials``, ``viewport``, ...)
and returns its page; every browser is closed when the test ends.

:func:`docs_screenshot` takes a page's picture for the docs: into the test's directory, so
that a test run leaves the work tree as it found it, and into ``docs/images/`` when
``MSGBROKER_DOCS_IMAGES=1`` is set (``MSGBROKER_DOCS_IMAGES=1 pytest -m screenshot``
refreshes every picture the docs show).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
DOCS_IMAGES = Path(__file__).parents[1] / "docs" / "images"
#: no GPU, no network but the page's, nothing in the background: a quiet, offline browser
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: how long a page may take to load, and an element to appear (milliseconds)
TIMEOUT_MS = 30_000


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup test installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        contexts: list[Any] = []

        def open_page(url: str, **options: Any) -> Any:
            profile: Path = tmp_path_factory.mktemp("chromium-profile")
            options.setdefault("viewport", {"width": 1280, "height": 900})
            context = playwright.chromium.launch_persistent_context(
                str(profile),
                executable_path=CHROMIUM,
                headless=True,
                args=list(ARGS),
                **options,
            )
            contexts.append(context)
            context.set_default_timeout(TIMEOUT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(url)
            return page

        try:
            yield open_page
        finally:
            for context in contexts:
                context.close()


def docs_screenshot(
    page: Any, name: str, tmp_path: Path, clip: dict[str, float] | None = None
) -> Path:
    """The whole page (or the part ``clip`` says: x, y, width, height, in the page's
    coordinates) as the PNG ``name``, in ``tmp_path`` or, with ``MSGBROKER_DOCS_IMAGES=1``,
    in docs/images; returns where it is."""
    where = DOCS_IMAGES if os.environ.get("MSGBROKER_DOCS_IMAGES") == "1" else tmp_path
    path = where / name
    page.screenshot(path=str(path), full_page=True, clip=clip)
    return path
