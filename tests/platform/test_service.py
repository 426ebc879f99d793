"""The platform as the test suite runs it: PostgreSQL behind the ORM, the health endpoint up."""

import importlib

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection


@pytest.mark.django_db
def test_tests_run_on_postgresql():
    # DATABASE_URL defaults to the local PostgreSQL for the test suite (pyproject's env option).
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    assert connection.vendor == "postgresql"
    assert connection.settings_dict["NAME"].startswith("test_")
    user = get_user_model().objects.create_user(username="ada", password="not-a-real-password")
    assert get_user_model().objects.get(pk=user.pk).username == "ada"


def test_healthz_answers_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_healthz_is_read_only(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.parametrize("module", ["config.asgi", "config.wsgi"])
def test_server_entry_points_import(module):
    assert callable(importlib.import_module(module).application)
