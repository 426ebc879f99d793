"""Browser (end-to-end) tests: Playwright's Python package drives the Debian chromium (never a downloaded
browser) against the live platform: daphne serving the dashboard, a Celery worker with its beat,
the engine the worker starts (real Ray actors, the tiny model), PostgreSQL and Redis. Screenshots
(``screenshots.screenshot``) go to ``test-artifacts/browser/``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.platform import live

CHROMIUM = os.environ.get("PLEXRL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def live_platform(engine_home, transactional_db, tmp_path) -> Iterator[live.LivePlatform]:
    """The platform as production runs it (``live.running_platform``)."""
    with live.running_platform(engine_home, tmp_path) as platform:
        yield platform


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: `make install` installs it (apt-get install chromium), "
                    "or set PLEXRL_CHROMIUM to a Chromium binary")
    # Playwright's sync API leaves its event loop marked as running in this thread between calls;
    # the tests' own ORM calls (users, checks, the database flush) are still plain synchronous ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()


@pytest.fixture
def page(browser, live_platform):
    """A fresh browser context (no cookies) at a laptop's screen size; downloads allowed. The
    pages' Content-Security-Policy is enforced, and the test fails if anything on them broke it."""
    context = browser.new_context(base_url=live_platform.url, viewport={"width": 1366, "height": 768},
                                  accept_downloads=True)
    context.set_default_timeout(30_000)
    page = context.new_page()
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text)
            if "Content Security Policy" in message.text else None)
    yield page
    context.close()
    assert not violations, violations

