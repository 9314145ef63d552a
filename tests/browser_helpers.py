"""Headless Chromium for the browser tests, the README screenshots and the page benchmark.

Playwright drives the system Chromium (``/usr/bin/chromium``, installed by scripts/install.sh with the OS
package manager): Playwright's own browser download needs a network we do not assume. Every request the
page makes is recorded (and refused), as is every console error, so a test can assert there were none.
When Chromium or Playwright is missing, :func:`browser_or_skip` skips -- except under CI (``CI`` set),
where it fails: a browser test that silently stops running is worse than a red build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # several pages in one browser: a page in the background must not have its timers (ELK's) throttled
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def chromium_path() -> str | None:
    configured = os.environ.get("FXFORGE_CHROMIUM")
    if configured:
        return configured
    return next((path for path in CHROMIUM_CANDIDATES if Path(path).exists()), shutil.which("chromium"))


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "no Chromium at /usr/bin/chromium (bash scripts/install.sh installs it)"
    return None


def browser_or_skip() -> None:
    import pytest

    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run under CI: {reason}")
    pytest.skip(reason)


@dataclass
class PageRecord:
    """What a page did: console errors, page errors and every request it tried."""

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A Chromium browser (Playwright) with a fresh profile, closed on exit."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="fxforge-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=chromium_path(),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1400, "height": 900},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def open_page(context: Any, path: Path, record: PageRecord, *, timeout_ms: int = 30_000) -> Any:
    """Open ``path`` (file://), recording console errors and refusing (and recording) every network request;
    returns the page once the viewer reports ready (``body[data-ready]``) or the page has no viewer."""
    for old in context.pages:  # one page at a time: the one under test is in front
        old.close()
    page = context.new_page()
    page.on("console", lambda message: record.console_errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: record.console_errors.append(str(error)))

    def route(route: Any) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            record.requests.append(url)
            route.abort()

    page.route("**/*", route)
    page.on(
        "request",
        lambda request: (
            None
            if request.url.startswith(("file:", "data:", "blob:", "about:"))
            else record.requests.append(request.url)
        ),
    )
    page.goto(path.resolve().as_uri())
    if page.query_selector("#fxg-model") is not None:
        page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
    return page
