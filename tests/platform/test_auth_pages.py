"""django.contrib.auth's pages under /accounts/: login, password change and reset by e-mail."""

import pytest

from tests.platform.factories import PASSWORD, UserFactory


@pytest.mark.django_db
def test_password_reset_sends_a_link(client, mailoutbox):
    UserFactory(username="ada", email="ada@example.com")
    response = client.post("/accounts/password_reset/", {"email": "ada@example.com"})
    assert response.status_code == 302
    assert len(mailoutbox) == 1
    assert mailoutbox[0].subject == "PlexRL password reset"
    assert "PlexRL account ada" in mailoutbox[0].body
    link = next(line for line in mailoutbox[0].body.splitlines() if "/accounts/reset/" in line)
    confirm = client.get(link.split("testserver", 1)[1], follow=True)
    assert b"Choose a new password" in confirm.content


@pytest.mark.django_db
def test_login_and_password_change(client):
    user = UserFactory(username="ada")
    assert client.get("/accounts/password_change/").status_code == 302  # to the login page first
    assert b"Log in" in client.get("/accounts/login/").content
    assert client.post("/accounts/login/", {"username": "ada", "password": PASSWORD}).status_code == 302
    response = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": "a-new-long-passphrase", "new_password2": "a-new-long-passphrase"},
    )
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password("a-new-long-passphrase")


@pytest.mark.slow
def test_mail_goes_to_the_console_by_default(manage):
    code = "from django.conf import settings; print(settings.EMAIL_BACKEND)"
    result = manage("shell", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "django.core.mail.backends.console.EmailBackend"
    result = manage("shell", "-c", code, env={"EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"})
    assert result.stdout.strip().splitlines()[-1] == "django.core.mail.backends.smtp.EmailBackend"


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["user", "organization", "membership", "apitoken", "plan", "auditlog"])
def test_admin_lists_every_accounts_model(admin_client, tenant, model):
    assert admin_client.get(f"/admin/accounts/{model}/").status_code == 200


@pytest.mark.django_db
def test_the_browsable_api_renders_for_a_session(tenant, session_client):
    client = session_client(tenant.owner)
    for url in ("/api/v1/tokens/", "/api/v1/quota/", f"/api/v1/organizations/{tenant.organization.pk}/members/"):
        response = client.get(url, HTTP_ACCEPT="text/html")
        assert response.status_code == 200, url
        assert b"<html" in response.content


@pytest.mark.django_db
def test_accounts_admin_is_read_only_except_users(admin_client, tenant):
    assert admin_client.get("/admin/accounts/membership/add/").status_code == 403
    membership = tenant.organization.memberships.get(user=tenant.owner)
    page = admin_client.get(f"/admin/accounts/membership/{membership.pk}/change/")
    assert page.status_code == 200  # view only
    assert b'name="role"' not in page.content
    assert admin_client.get(f"/admin/accounts/user/{tenant.owner.pk}/change/").status_code == 200
