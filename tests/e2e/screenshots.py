"""Screenshots of the browser tests, saved under ``test-artifacts/browser/``."""

from __future__ import annotations

from pathlib import Path

from tests.platform import live

ARTIFACTS = live.REPO / "test-artifacts" / "browser"


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
