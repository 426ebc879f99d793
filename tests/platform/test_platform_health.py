"""The platform as the test suite runs it: PostgreSQL behind the ORM, the health endpoint up, served
through both server entry points (``config.wsgi`` and ``config.asgi``)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import RequestFactory

from tests.platform import asgi_client


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


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "options", "trace", "head"])
def test_healthz_is_read_only(client, method):
    # only GET answers (require_GET: not even HEAD); everything else is refused, and says so
    response = getattr(client, method)("/healthz")
    assert response.status_code == 405
    assert response["Allow"] == "GET"
    assert response.content == b""


def test_the_wsgi_entry_point_serves_a_request():
    from config.wsgi import application

    environ = RequestFactory().get("/healthz").environ
    started = []

    def start_response(status, headers, exc_info=None):
        started.append((status, headers))

    def serve() -> bytes:
        # as a threaded WSGI server does: the request's close_old_connections (request_started,
        # request_finished) sees this thread's database connections, never the test's
        response = application(environ, start_response)
        try:
            return b"".join(response)
        finally:
            response.close()

    with ThreadPoolExecutor(1) as server:
        body = server.submit(serve).result(timeout=30)
    [(status, headers)] = started
    assert status == "200 OK"
    assert ("Content-Type", "application/json") in headers
    assert json.loads(body) == {"status": "ok"}


@pytest.mark.asyncio
async def test_the_asgi_entry_point_serves_a_request():
    response = await asgi_client.get("/healthz")  # config.asgi's application, as a server drives it
    assert response["status"] == 200
    assert (b"Content-Type", b"application/json") in response["headers"]
    assert json.loads(response["body"]) == {"status": "ok"}
