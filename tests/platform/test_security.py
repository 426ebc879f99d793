"""Hardening of the web tier: security headers on every response, a script policy the API docs
page keeps to, the sign-in page throttled, CSRF on the UI's forms."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from rest_framework.throttling import ScopedRateThrottle

from tests.platform.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/accounts/login/", "/api/v1/jobs/", "/healthz", "/api/docs/", "/nowhere/"])
def test_every_response_carries_the_security_headers(client, path):
    response = client.get(path)
    csp = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'"  # no inline script, no other origin
    assert csp["frame-ancestors"] == "'none'"
    assert csp["object-src"] == "'none'"
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    assert "camera=()" in response["Permissions-Policy"]


def test_the_api_docs_page_loads_its_start_up_script_from_its_own_url(client):
    html = client.get("/api/docs/").content.decode()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, flags=re.S)
    assert scripts
    assert all("src=" in attrs and not body.strip() for attrs, body in scripts), scripts  # nothing inline
    src = re.search(r'<script src="([^"]*\?script=[^"]*)"', html).group(1).replace("&amp;", "&")
    script = client.get(src)
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert b"SwaggerUIBundle" in script.content


def test_the_sign_in_page_is_throttled_per_address(monkeypatch):
    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", {"login": "2/minute"})
    UserFactory(username="ada")
    client = Client()
    for _ in range(2):
        response = client.post("/accounts/login/", {"username": "ada", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    response = client.post("/accounts/login/", {"username": "ada", "password": PASSWORD})
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b"Too many sign-in attempts" in response.content
    assert "_auth_user_id" not in client.session  # the right password did not sign in
    # another address is not held back
    other = Client(REMOTE_ADDR="10.0.0.7")
    assert other.post("/accounts/login/", {"username": "ada", "password": PASSWORD}).status_code == 302


def test_the_ui_forms_need_the_csrf_token():
    UserFactory(username="ada")
    client = Client(enforce_csrf_checks=True)
    assert client.post("/accounts/login/", {"username": "ada", "password": PASSWORD}).status_code == 403
    client.get("/accounts/login/")  # sets the cookie; the form carries the token
    token = client.cookies["csrftoken"].value
    assert client.post("/accounts/login/", {"username": "ada", "password": PASSWORD,
                                            "csrfmiddlewaretoken": token}).status_code == 302
    assert client.post("/accounts/password_change/", {"old_password": PASSWORD, "new_password1": "n3w-Pass-word!",
                                                      "new_password2": "n3w-Pass-word!"}).status_code == 403


def test_an_unexpected_api_error_answers_500_without_its_message_or_traceback(tenant, token_client, monkeypatch,
                                                                               caplog):
    from jobs import selectors

    def broken(**kwargs):
        raise RuntimeError("connection to db://admin:hunter2@10.0.0.1 failed")

    monkeypatch.setattr(selectors, "jobs_of", broken)
    response = token_client(tenant.owner, tenant.organization).get("/api/v1/jobs/")
    assert response.status_code == 500
    assert response.json() == {"detail": "Internal server error; it has been logged."}
    assert b"hunter2" not in response.content
    assert b"Traceback" not in response.content
    assert "hunter2" in caplog.text  # the server's log has it


def test_an_oversized_body_answers_413_with_the_limit(tenant, token_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    client = token_client(tenant.owner, tenant.organization)
    response = client.post("/api/v1/jobs/", {"name": "x", "spec": {"task": "arith", "model": "m" * 20_000}},
                           format="json")
    assert response.status_code == 413
    assert response.json() == {"detail": "The request body is too large: at most 10000 bytes."}
    assert client.get("/api/v1/jobs/").json()["count"] == 0  # nothing created


@pytest.mark.parametrize("key", ["abcdefgh\x00ijklmnop", "\x00" * 32, "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"])
def test_a_session_cookie_of_no_session_key_is_anonymous_not_an_error(client, key):
    """A NUL byte in the session id made PostgreSQL refuse the session lookup: a 500 on every page."""
    from django.conf import settings

    cookie = f"{settings.SESSION_COOKIE_NAME}={key}"
    assert client.get("/api/v1/jobs/", HTTP_COOKIE=cookie).status_code in (401, 403)
    response = client.get("/jobs/", HTTP_COOKIE=cookie)
    assert response.status_code == 302  # to sign in, as anybody without a session
    assert "login" in response["Location"]
