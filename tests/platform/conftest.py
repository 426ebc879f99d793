"""Fixtures for the Django side.

The database: pytest-django reads the settings before any conftest runs, so DATABASE_URL's
default (the local PostgreSQL) is set in pyproject's ``env`` option, not here.
"""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Variables the settings read; a subprocess starts from none of them unless a test sets them.
SETTINGS_ENV = {
    "DJANGO_SETTINGS_MODULE",
    "PLEXRL_ENV",
    "PLEXRL_HOME",
    "DJANGO_SECRET_KEY",
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "DATABASE_URL",
    "REDIS_URL",
    "RAY_ADDRESS",
    "PYTHONPATH",
}

ManageRunner = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def manage(tmp_path) -> ManageRunner:
    """Run ``manage.py`` in a fresh process with default settings and a temporary PLEXRL_HOME.

    ``manage("check", env={"PLEXRL_ENV": "production"})``; it runs from a temporary working
    directory, so it also proves that manage.py works from anywhere.
    """

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        clean = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
        clean["PLEXRL_HOME"] = str(tmp_path / "plexrl-home")
        return subprocess.run(
            [sys.executable, str(REPO / "manage.py"), *args],
            cwd=tmp_path,
            env={**clean, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run
