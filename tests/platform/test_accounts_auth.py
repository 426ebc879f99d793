"""Who is asking and in which organization: bearer tokens, browser sessions, POST auth/token/."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from rest_framework.throttling import ScopedRateThrottle

from accounts.api import ORGANIZATION_SESSION_KEY
from accounts.models import ApiToken, AuditLog, Membership, token_digest
from tests.platform.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"
ORGANIZATIONS = "/api/v1/organizations/"
OBTAIN = "/api/v1/auth/token/"


def detail(response) -> str:
    return response.json()["detail"]


# --- bearer tokens ------------------------------------------------------------------------------


def test_a_valid_token_authenticates_in_its_organization(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    response = client.get(ORGANIZATIONS)
    assert response.status_code == 200
    assert [(o["slug"], o["role"], o["current"]) for o in response.json()["results"]] == [("acme", "member", True)]


def test_missing_credentials_answer_401_with_a_bearer_challenge(tenant, api_client):
    response = api_client.get(TOKENS)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="api"'


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Bearer", "expected 'Bearer <token>'"),
        ("Bearer two parts", "expected 'Bearer <token>'"),
        ("Bearer plx_not-a-real-token", "Invalid token."),
    ],
)
def test_malformed_or_unknown_tokens_answer_401(tenant, api_client, header, message):
    api_client.credentials(HTTP_AUTHORIZATION=header)
    response = api_client.get(TOKENS)
    assert response.status_code == 401
    assert message in detail(response)


def test_a_revoked_token_answers_401(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    ApiToken.objects.filter(pk=client.token.pk).update(revoked_at=timezone.now())
    response = client.get(TOKENS)
    assert response.status_code == 401
    assert detail(response) == "This token has been revoked."


def test_an_expired_token_answers_401(tenant, token_client):
    client = token_client(tenant.member, tenant.organization, expires_in_days=1)
    assert client.get(TOKENS).status_code == 200
    ApiToken.objects.filter(pk=client.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get(TOKENS)
    assert response.status_code == 401
    assert detail(response) == "This token has expired."


def test_a_token_of_an_inactive_user_answers_401(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    tenant.member.is_active = False
    tenant.member.save()
    assert client.get(TOKENS).status_code == 401


def test_a_token_stops_working_when_its_user_leaves_the_organization(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    Membership.objects.filter(user=tenant.member).delete()  # behind the service's back: no revocation
    response = client.get(ORGANIZATIONS)
    assert response.status_code == 401
    assert "no longer a member" in detail(response)


def test_last_used_at_is_written_at_most_once_a_minute(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    assert client.get(TOKENS).status_code == 200
    first = ApiToken.objects.get(pk=client.token.pk).last_used_at
    assert first is not None
    client.get(TOKENS)
    assert ApiToken.objects.get(pk=client.token.pk).last_used_at == first
    ApiToken.objects.filter(pk=client.token.pk).update(last_used_at=first - timedelta(minutes=2))
    client.get(TOKENS)
    assert ApiToken.objects.get(pk=client.token.pk).last_used_at > first


# --- browser sessions ---------------------------------------------------------------------------


def test_a_session_starts_in_the_first_organization_and_switches(tenant, other_tenant, session_client):
    MembershipFactory(user=tenant.viewer, organization=other_tenant.organization, role="admin")
    client = session_client(tenant.viewer)
    assert client.get("/api/v1/audit/").status_code == 403  # a viewer in acme, the first by id
    rows = client.get(ORGANIZATIONS).json()["results"]
    assert [(o["slug"], o["role"], o["current"]) for o in rows] == [
        ("acme", "viewer", True),
        ("globex", "admin", False),
    ]

    response = client.post(f"/api/v1/organizations/{other_tenant.organization.pk}/switch/")
    assert response.status_code == 200
    assert (response.json()["slug"], response.json()["current"]) == ("globex", True)
    assert client.session[ORGANIZATION_SESSION_KEY] == other_tenant.organization.pk
    assert client.get("/api/v1/audit/").status_code == 200  # an admin in globex now
    members = client.get(f"/api/v1/organizations/{other_tenant.organization.pk}/members/")
    assert members.status_code == 200
    assert client.get(f"/api/v1/organizations/{tenant.organization.pk}/members/").status_code == 404


def test_switching_to_an_organization_that_is_not_yours_answers_404(tenant, other_tenant, session_client):
    client = session_client(tenant.owner)
    assert client.post(f"/api/v1/organizations/{other_tenant.organization.pk}/switch/").status_code == 404
    assert client.post("/api/v1/organizations/999999/switch/").status_code == 404
    assert client.post(f"/api/v1/organizations/{tenant.organization.pk}/switch/", {"x": 1}).status_code == 400


def test_tokens_cannot_switch(tenant, token_client):
    client = token_client(tenant.owner, tenant.organization)
    response = client.post(f"/api/v1/organizations/{tenant.organization.pk}/switch/")
    assert response.status_code == 403
    assert "browser sessions" in detail(response)


def test_a_session_falls_back_when_its_organization_is_gone(tenant, other_tenant, session_client):
    MembershipFactory(user=tenant.member, organization=other_tenant.organization, role="member")
    client = session_client(tenant.member)
    client.post(f"/api/v1/organizations/{other_tenant.organization.pk}/switch/")
    Membership.objects.filter(user=tenant.member, organization=other_tenant.organization).delete()
    rows = client.get(ORGANIZATIONS).json()["results"]
    assert [(o["slug"], o["current"]) for o in rows] == [("acme", True)]
    assert client.session[ORGANIZATION_SESSION_KEY] == tenant.organization.pk


def test_a_session_user_of_no_organization_sees_nothing(db, session_client):
    client = session_client(UserFactory())
    assert client.get(ORGANIZATIONS).json()["results"] == []
    response = client.get(TOKENS)
    assert response.status_code == 403
    assert detail(response) == "You are not a member of any organization."


def test_session_writes_need_the_csrf_token(tenant):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(tenant.owner)
    response = client.post(TOKENS, {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in detail(response)
    assert not ApiToken.objects.exists()


# --- POST auth/token/ ---------------------------------------------------------------------------


def test_obtain_token_returns_the_plaintext_once_and_it_works(tenant, api_client):
    response = api_client.post(
        OBTAIN, {"username": "acme-member", "password": PASSWORD, "name": "laptop", "expires_days": 7}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    plaintext = body["token"]
    assert (body["name"], body["organization"], body["prefix"]) == ("laptop", tenant.organization.pk, plaintext[:12])
    assert ApiToken.objects.get(pk=body["id"]).digest == token_digest(plaintext)
    assert AuditLog.objects.filter(action="token.created", actor=tenant.member).count() == 1

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    listed = client.get(TOKENS)
    assert listed.status_code == 200
    assert plaintext not in listed.content.decode()
    assert "token" not in listed.json()["results"][0]


@pytest.mark.parametrize("password", ["wrong", ""])
def test_obtain_token_with_wrong_credentials_is_a_400_non_field_error(tenant, api_client, password):
    response = api_client.post(OBTAIN, {"username": "acme-member", "password": password}, format="json")
    assert response.status_code == 400
    body = response.json()
    if password:
        assert body == {"non_field_errors": ["Unable to log in with the given username and password."]}
    else:
        assert "password" in body
    assert not ApiToken.objects.exists()


def test_obtain_token_needs_the_organization_when_the_user_has_several(tenant, other_tenant, api_client):
    MembershipFactory(user=tenant.admin, organization=other_tenant.organization, role="viewer")
    credentials = {"username": "acme-admin", "password": PASSWORD}
    response = api_client.post(OBTAIN, credentials, format="json")
    assert response.status_code == 400
    assert "several organizations" in response.json()["organization"][0]
    assert not ApiToken.objects.exists()

    by_slug = api_client.post(OBTAIN, {**credentials, "organization": "globex"}, format="json")
    assert by_slug.status_code == 201
    assert by_slug.json()["organization"] == other_tenant.organization.pk
    by_id = api_client.post(OBTAIN, {**credentials, "organization": str(tenant.organization.pk)}, format="json")
    assert by_id.json()["organization"] == tenant.organization.pk


def test_obtain_token_for_an_organization_not_yours_is_refused(tenant, other_tenant, api_client):
    response = api_client.post(
        OBTAIN, {"username": "acme-owner", "password": PASSWORD, "organization": "globex"}, format="json"
    )
    assert response.status_code == 400
    assert "organization" in response.json()
    loner = UserFactory()
    response = api_client.post(OBTAIN, {"username": loner.username, "password": PASSWORD}, format="json")
    assert response.json() == {"organization": ["You are not a member of any organization."]}
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({}, {"username", "password"}),
        ({"username": "acme-member", "password": PASSWORD, "scope": "all"}, {"scope"}),
        ({"username": "acme-member", "password": PASSWORD, "expires_days": "soon"}, {"expires_days"}),
        ({"username": "acme-member", "password": PASSWORD, "expires_days": 0}, {"expires_days"}),
        ({"username": ["acme-member"], "password": PASSWORD}, {"username"}),
    ],
    ids=["missing", "extra", "wrong-type", "zero-days", "list-username"],
)
def test_obtain_token_rejects_malformed_input_field_by_field(tenant, api_client, payload, fields):
    response = api_client.post(OBTAIN, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert not ApiToken.objects.exists()


def test_obtain_token_is_throttled(tenant, api_client, monkeypatch):
    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", {"auth-token": "2/minute"})
    for _ in range(2):
        assert api_client.post(OBTAIN, {"username": "acme-member", "password": "x"}, format="json").status_code == 400
    assert api_client.post(OBTAIN, {"username": "acme-member", "password": PASSWORD}, format="json").status_code == 429
