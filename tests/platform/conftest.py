"""Fixtures for the Django side.

The database: pytest-django reads the settings before any conftest runs, so DATABASE_URL's
default (the local PostgreSQL) is set in pyproject's ``env`` option, not here.
"""

import copy
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from accounts import services
from accounts.models import Organization, User
from tests.platform.tenants import Tenant, make_tenant

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
    "EMAIL_BACKEND",
    "DEFAULT_FROM_EMAIL",
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


# --- the accounts app: two tenants, clients with tokens -----------------------------------------


@pytest.fixture(autouse=True)
def _fast_passwords_and_fresh_throttles(settings):
    """A fast password hasher (the default costs ~0.3 s a user), and an empty cache so the
    login throttle of POST auth/token/ counts each test's requests only."""
    from django.core.cache import cache

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()


@pytest.fixture
def tenant(db) -> Tenant:
    """The organization the tests act in: acme."""
    return make_tenant("acme")


@pytest.fixture
def other_tenant(db) -> Tenant:
    """Another organization, whose objects the tests must never see: globex."""
    return make_tenant("globex")


@pytest.fixture
def api_client() -> APIClient:
    """An anonymous client."""
    return APIClient()


@pytest.fixture
def token_client(db) -> Callable[..., APIClient]:
    """``token_client(user, organization)``: a client sending a fresh bearer token of ``user``
    in ``organization`` (``client.token`` is the ApiToken, ``client.plaintext`` its secret)."""

    def make(user: User, organization: Organization, **kwargs) -> APIClient:
        token, plaintext = services.token_create(user=user, organization=organization, name="test", **kwargs)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        client.token, client.plaintext = token, plaintext
        return client

    return make


@pytest.fixture
def session_client(db) -> Callable[[User], APIClient]:
    """``session_client(user)``: a client logged in through a Django session (a browser)."""

    def make(user: User) -> APIClient:
        client = APIClient()
        client.force_login(user)
        return client

    return make


# --- websockets ---------------------------------------------------------------------------------


@pytest.fixture
def own_channel_layer(settings):
    """The settings' channel layer under a prefix of this test alone: other test runs share the
    Redis database. The websocket tests use it on every test (``pytest.mark.usefixtures``)."""
    layer = copy.deepcopy(settings.CHANNEL_LAYERS["default"])
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"  # REDIS_URL is set in tests
    layer["CONFIG"]["prefix"] = f"test-ws-{uuid.uuid4().hex}"
    settings.CHANNEL_LAYERS = {"default": layer}
