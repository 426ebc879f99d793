"""The accounts REST API with two tenants: each endpoint, each role, malformed input, audit rows.

Another organization's objects answer 404 and are never listed; viewers cannot write (403);
malformed input answers 400 field by field and changes nothing.
"""

import pytest

from accounts import services
from accounts.models import ApiToken, AuditLog, Membership, Organization, Plan, Role
from tests.platform.factories import MembershipFactory, PlanFactory, UserFactory

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"
ORGANIZATIONS = "/api/v1/organizations/"
QUOTA = "/api/v1/quota/"
AUDIT = "/api/v1/audit/"


def members_url(organization, user=None) -> str:
    base = f"/api/v1/organizations/{organization.pk}/members/"
    return f"{base}{user.pk}/" if user else base


def revoke_url(token) -> str:
    return f"/api/v1/tokens/{token.pk}/revoke/"


def audit_actions(organization) -> list[str]:
    return list(AuditLog.objects.filter(organization=organization).order_by("id").values_list("action", flat=True))


# --- tokens -------------------------------------------------------------------------------------


def test_token_list_holds_your_tokens_here_and_no_secrets(tenant, other_tenant, token_client):
    MembershipFactory(user=tenant.member, organization=other_tenant.organization)
    client = token_client(tenant.member, tenant.organization)
    _, elsewhere_plain = services.token_create(
        user=tenant.member, organization=other_tenant.organization, name="elsewhere"
    )
    services.token_create(user=tenant.admin, organization=tenant.organization, name="colleague")
    response = client.get(TOKENS)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    row = body["results"][0]
    assert set(row) == {
        "id", "name", "prefix", "user", "organization", "created_at", "expires_at", "last_used_at", "revoked_at"
    }  # fmt: skip
    assert (row["id"], row["user"], row["prefix"]) == (client.token.pk, "acme-member", client.plaintext[:12])
    text = response.content.decode()
    for secret in (client.plaintext, client.token.digest, elsewhere_plain):
        assert secret not in text


def test_token_create_shows_the_plaintext_once(tenant, token_client):
    client = token_client(tenant.viewer, tenant.organization)  # tokens are personal: viewers too
    response = client.post(TOKENS, {"name": "notebook", "expires_days": 90}, format="json")
    assert response.status_code == 201
    created = response.json()
    token = ApiToken.objects.get(pk=created["id"])
    assert created["token"].startswith(token.prefix)
    assert (token.user, token.organization, token.name) == (tenant.viewer, tenant.organization, "notebook")
    listed = client.get(TOKENS).json()["results"]
    assert {row["id"] for row in listed} == {created["id"], client.token.pk}
    assert all("token" not in row for row in listed)
    assert created["token"] not in client.get(TOKENS).content.decode()
    assert audit_actions(tenant.organization).count("token.created") == 2


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({"name": "x", "user": "acme-owner"}, {"user"}),
        ({"name": "x", "expires_days": "never"}, {"expires_days"}),
        ({"name": "x", "expires_days": -3}, {"expires_days"}),
        ({"name": ""}, {"name"}),
        ({"name": "x" * 101}, {"name"}),
        ({"token": "plx_chosen-by-me"}, {"token"}),
    ],
    ids=["extra", "wrong-type", "negative", "blank", "too-long", "read-only"],
)
def test_token_create_rejects_malformed_input(tenant, token_client, payload, fields):
    client = token_client(tenant.member, tenant.organization)
    before = ApiToken.objects.count(), AuditLog.objects.count()
    response = client.post(TOKENS, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert (ApiToken.objects.count(), AuditLog.objects.count()) == before


def test_revoke_your_own_token(tenant, token_client):
    client = token_client(tenant.viewer, tenant.organization)
    other, _ = services.token_create(user=tenant.viewer, organization=tenant.organization, name="old")
    response = client.post(revoke_url(other))
    assert response.status_code == 200
    assert response.json()["revoked_at"] is not None
    assert audit_actions(tenant.organization)[-1] == "token.revoked"
    # Revoking the token in use: the next request with it is refused.
    assert client.post(revoke_url(client.token)).status_code == 200
    assert client.get(TOKENS).status_code == 401


def test_members_cannot_see_or_revoke_colleagues_tokens_but_admins_can(tenant, token_client):
    colleague, _ = services.token_create(user=tenant.owner, organization=tenant.organization, name="owner's")
    member = token_client(tenant.member, tenant.organization)
    assert member.post(revoke_url(colleague)).status_code == 404
    assert ApiToken.objects.get(pk=colleague.pk).revoked_at is None
    admin = token_client(tenant.admin, tenant.organization)
    assert admin.post(revoke_url(colleague)).status_code == 200
    row = AuditLog.objects.filter(action="token.revoked").get()
    assert (row.actor, row.data["user"]) == (tenant.admin, "acme-owner")


def test_another_organizations_token_answers_404(tenant, other_tenant, token_client):
    theirs, _ = services.token_create(user=other_tenant.member, organization=other_tenant.organization, name="t")
    owner = token_client(tenant.owner, tenant.organization)
    assert owner.post(revoke_url(theirs)).status_code == 404
    assert owner.post("/api/v1/tokens/987654/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None


def test_revoke_takes_no_input(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    response = client.post(revoke_url(client.token), {"reason": "lost"}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"reason"}
    assert ApiToken.objects.get(pk=client.token.pk).revoked_at is None


# --- organizations ------------------------------------------------------------------------------


def test_organization_list_never_shows_others(tenant, other_tenant, token_client, session_client):
    assert [o["slug"] for o in session_client(tenant.owner).get(ORGANIZATIONS).json()["results"]] == ["acme"]
    MembershipFactory(user=tenant.owner, organization=other_tenant.organization, role=Role.MEMBER)
    both = session_client(tenant.owner).get(ORGANIZATIONS).json()["results"]
    assert [(o["slug"], o["role"]) for o in both] == [("acme", "owner"), ("globex", "member")]
    # A token acts in one organization and lists only that one.
    only = token_client(tenant.owner, other_tenant.organization).get(ORGANIZATIONS).json()["results"]
    assert [(o["slug"], o["role"], o["current"]) for o in only] == [("globex", "member", True)]


def test_staff_create_organizations(tenant, session_client):
    staff = UserFactory(is_staff=True)
    response = session_client(staff).post(
        ORGANIZATIONS, {"name": "Initech", "owner": "acme-viewer"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["name"], body["slug"], body["role"]) == ("Initech", "initech", None)
    organization = Organization.objects.get(slug="initech")
    assert Membership.objects.get(organization=organization).user == tenant.viewer
    assert organization.plan.name == "starter"  # the default plan, never an unlimited one
    assert audit_actions(organization) == ["organization.created"]


def test_only_staff_create_organizations(tenant, token_client):
    response = token_client(tenant.owner, tenant.organization).post(
        ORGANIZATIONS, {"name": "Initech", "owner": "acme-owner"}, format="json"
    )
    assert response.status_code == 403
    assert not Organization.objects.filter(name="Initech").exists()


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({"name": "Initech"}, {"owner"}),
        ({"name": "Initech", "owner": "nobody"}, {"owner"}),
        ({"name": "Acme", "owner": "acme-owner"}, {"name"}),
        ({"name": "Initech", "owner": "acme-owner", "slug": "not a slug"}, {"slug"}),
        ({"name": "Initech", "owner": "acme-owner", "quota": 5}, {"quota"}),
        ({"name": 12, "owner": ["acme-owner"]}, {"owner"}),
    ],
    ids=["missing-owner", "unknown-owner", "taken-name", "bad-slug", "extra", "wrong-type"],
)
def test_organization_create_rejects_malformed_input(tenant, session_client, payload, fields):
    client = session_client(UserFactory(is_staff=True))
    before = Organization.objects.count(), Membership.objects.count(), AuditLog.objects.count()
    response = client.post(ORGANIZATIONS, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert (Organization.objects.count(), Membership.objects.count(), AuditLog.objects.count()) == before


# --- members ------------------------------------------------------------------------------------


def test_member_list(tenant, other_tenant, token_client):
    response = token_client(tenant.viewer, tenant.organization).get(members_url(tenant.organization))
    assert response.status_code == 200
    rows = response.json()["results"]
    assert [(r["username"], r["role"]) for r in rows] == [
        ("acme-owner", "owner"), ("acme-admin", "admin"), ("acme-member", "member"), ("acme-viewer", "viewer")
    ]  # fmt: skip
    assert rows[0]["user_id"] == tenant.owner.pk


def test_another_organizations_members_answer_404_even_to_their_member(tenant, other_tenant, token_client):
    MembershipFactory(user=tenant.owner, organization=other_tenant.organization, role=Role.OWNER)
    client = token_client(tenant.owner, tenant.organization)  # the token is acme's
    assert client.get(members_url(other_tenant.organization)).status_code == 404
    assert client.post(members_url(other_tenant.organization), {"username": "acme-viewer"}).status_code == 404
    assert client.get(members_url(other_tenant.organization, other_tenant.member)).status_code == 404
    patch = client.patch(members_url(other_tenant.organization, other_tenant.member), {"role": "viewer"})
    assert patch.status_code == 404
    assert client.delete(members_url(other_tenant.organization, other_tenant.member)).status_code == 404
    # A member of the other tenant, addressed through this organization's URL: not here, 404.
    assert client.get(members_url(tenant.organization, other_tenant.member)).status_code == 404
    assert client.delete(members_url(tenant.organization, other_tenant.member)).status_code == 404
    assert Membership.objects.filter(organization=other_tenant.organization).count() == 5
    assert Membership.objects.get(user=other_tenant.member).role == Role.MEMBER


def test_admins_add_members(tenant, token_client):
    newcomer = UserFactory(username="newcomer")
    client = token_client(tenant.admin, tenant.organization)
    response = client.post(members_url(tenant.organization), {"username": "newcomer", "role": "viewer"}, format="json")
    assert response.status_code == 201
    assert (response.json()["username"], response.json()["role"]) == ("newcomer", "viewer")
    assert Membership.objects.get(user=newcomer).organization == tenant.organization
    row = AuditLog.objects.get(action="member.added")
    assert (row.actor, row.target) == (tenant.admin, "newcomer")


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_viewers_and_members_cannot_change_members(tenant, token_client, role):
    UserFactory(username="newcomer")
    client = token_client(tenant.user(role), tenant.organization)
    before = list(Membership.objects.values_list("user", "role"))
    assert client.post(members_url(tenant.organization), {"username": "newcomer"}, format="json").status_code == 403
    patch = client.patch(members_url(tenant.organization, tenant.viewer), {"role": "admin"}, format="json")
    assert patch.status_code == 403
    response = client.delete(members_url(tenant.organization, tenant.viewer))
    assert response.status_code == 403
    assert "admin role or higher" in response.json()["detail"]
    assert list(Membership.objects.values_list("user", "role")) == before


def test_only_owners_add_owners_through_the_api(tenant, token_client):
    UserFactory(username="newcomer")
    payload = {"username": "newcomer", "role": "owner"}
    response = token_client(tenant.admin, tenant.organization).post(members_url(tenant.organization), payload)
    assert response.status_code == 403
    assert "Only owners" in response.json()["detail"]
    owner = token_client(tenant.owner, tenant.organization)
    assert owner.post(members_url(tenant.organization), payload).status_code == 201


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({}, {"username"}),
        ({"username": "nobody"}, {"username"}),
        ({"username": "acme-viewer"}, {"username"}),  # already a member
        ({"username": "newcomer", "role": "king"}, {"role"}),
        ({"username": "newcomer", "organization": 2}, {"organization"}),
        ({"username": {"name": "newcomer"}}, {"username"}),
    ],
    ids=["missing", "unknown-user", "already-member", "bad-role", "extra", "wrong-type"],
)
def test_member_add_rejects_malformed_input(tenant, token_client, payload, fields):
    UserFactory(username="newcomer")
    client = token_client(tenant.owner, tenant.organization)
    before = Membership.objects.count(), AuditLog.objects.count()
    response = client.post(members_url(tenant.organization), payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert (Membership.objects.count(), AuditLog.objects.count()) == before


def test_admins_change_roles(tenant, token_client):
    client = token_client(tenant.admin, tenant.organization)
    response = client.patch(members_url(tenant.organization, tenant.member), {"role": "viewer"}, format="json")
    assert response.status_code == 200
    assert response.json()["role"] == "viewer"
    assert Membership.objects.get(user=tenant.member).role == Role.VIEWER
    assert AuditLog.objects.get(action="member.role_changed").data["to"] == "viewer"
    for payload in ({"role": "emperor"}, {}, {"role": "admin", "username": "x"}):
        assert client.patch(members_url(tenant.organization, tenant.member), payload, format="json").status_code == 400
    assert Membership.objects.get(user=tenant.member).role == Role.VIEWER


def test_the_last_owner_stays_through_the_api(tenant, token_client):
    owner = token_client(tenant.owner, tenant.organization)
    before = AuditLog.objects.count()
    demote = owner.patch(members_url(tenant.organization, tenant.owner), {"role": "admin"}, format="json")
    assert demote.status_code == 400
    assert "last owner" in demote.json()["non_field_errors"][0]
    assert owner.delete(members_url(tenant.organization, tenant.owner)).status_code == 400
    assert Membership.objects.get(user=tenant.owner).role == Role.OWNER
    assert AuditLog.objects.count() == before
    admin = token_client(tenant.admin, tenant.organization)
    assert admin.delete(members_url(tenant.organization, tenant.owner)).status_code == 403


def test_removing_a_member_revokes_their_tokens(tenant, token_client):
    removed = token_client(tenant.member, tenant.organization)
    response = token_client(tenant.admin, tenant.organization).delete(members_url(tenant.organization, tenant.member))
    assert response.status_code == 204
    assert not Membership.objects.filter(user=tenant.member).exists()
    assert removed.get(TOKENS).status_code == 401
    assert AuditLog.objects.get(action="member.removed").data["tokens_revoked"] == 1


# --- quota: the organization's plan, read by tenants, set by staff only -----------------------


def test_quota_shows_the_plan_to_viewers_and_only_this_tenant(tenant, other_tenant, token_client):
    services.plan_assign(organization=other_tenant.organization, actor=None,
                         plan=PlanFactory(name="big", max_devices_per_job=64))
    services.plan_assign(organization=tenant.organization, actor=None,
                         plan=PlanFactory(name="small", max_devices_per_job=8, weight=2.5, max_priority="high"))
    response = token_client(tenant.viewer, tenant.organization).get(QUOTA)
    assert response.status_code == 200
    body = response.json()
    assert (body["organization"], body["plan"], body["weight"], body["max_priority"]) == (
        tenant.organization.pk, "small", 2.5, "high")
    assert (body["max_devices_per_job"], body["device_hours_per_month"], body["max_concurrent_jobs"]) == (8, None, None)
    assert body["usage"] == {"device_hours_this_month": 0.0, "over_budget_device_hours": None, "concurrent_jobs": 0,
                             "queued_jobs": 0}


@pytest.mark.parametrize("role", ["owner", "admin", "member", "viewer"])
def test_no_tenant_role_changes_its_quota_plan_or_weight(tenant, token_client, role):
    plan = PlanFactory(name="small", max_concurrent_jobs=1, device_hours_per_month=5, weight=1.0)
    services.plan_assign(organization=tenant.organization, actor=None, plan=plan)
    PlanFactory(name="big")
    client = token_client(tenant.user(role), tenant.organization)
    before = list(AuditLog.objects.values_list("pk", flat=True))
    attempts = [
        client.patch(QUOTA, {"max_concurrent_jobs": 9, "device_hours_per_month": None}, format="json"),
        client.patch(f"/api/v1/plans/{plan.pk}/", {"weight": 50, "max_concurrent_jobs": None}, format="json"),
        client.put(f"/api/v1/organizations/{tenant.organization.pk}/plan/", {"plan": "big"}, format="json"),
        client.post("/api/v1/plans/", {"name": "mine", "weight": 100}, format="json"),
    ]
    assert [a.status_code for a in attempts] == [403, 403, 403, 403]
    assert "set by platform staff" in attempts[0].json()["detail"]
    plan.refresh_from_db()
    tenant.organization.refresh_from_db()
    assert (tenant.organization.plan.name, plan.max_concurrent_jobs, plan.device_hours_per_month, plan.weight) == (
        "small", 1, 5, 1.0)
    assert not Plan.objects.filter(name="mine").exists()
    assert list(AuditLog.objects.exclude(action="token.created").exclude(pk__in=before)) == []


# --- audit --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("role", "status"), [("owner", 200), ("admin", 200), ("member", 403), ("viewer", 403)])
def test_audit_log_is_for_owners_and_admins(tenant, token_client, role, status):
    assert token_client(tenant.user(role), tenant.organization).get(AUDIT).status_code == status


def test_audit_log_is_newest_first_and_only_this_tenant(tenant, other_tenant, token_client, session_client):
    staff = UserFactory(username="ops", is_staff=True)
    services.plan_assign(organization=other_tenant.organization, actor=staff, plan=PlanFactory(name="other"))
    client = token_client(tenant.admin, tenant.organization)  # writes token.created
    PlanFactory(name="pro")
    response = session_client(staff).put(f"/api/v1/organizations/{tenant.organization.pk}/plan/", {"plan": "pro"},
                                         format="json")
    assert response.status_code == 200, response.json()
    rows = client.get(AUDIT).json()["results"]
    assert [(r["action"], r["actor"]) for r in rows] == [
        ("plan.assigned", "ops"),
        ("token.created", "acme-admin"),
    ]
    assert rows[0]["data"] == {"from": "unlimited", "to": "pro"}


def test_lists_are_paginated_50_a_page_up_to_200(tenant, token_client):
    client = token_client(tenant.owner, tenant.organization)  # one token.created row
    AuditLog.objects.bulk_create(
        AuditLog(organization=tenant.organization, action="test.happened", target=str(n)) for n in range(250)
    )
    first = client.get(AUDIT).json()
    assert (first["count"], len(first["results"])) == (251, 50)
    assert first["next"].endswith("?page=2")
    assert len(client.get(AUDIT, {"page": 6}).json()["results"]) == 1
    assert len(client.get(AUDIT, {"page_size": 5}).json()["results"]) == 5
    assert len(client.get(AUDIT, {"page_size": 1000}).json()["results"]) == 200
    assert client.get(AUDIT, {"page": 9}).status_code == 404
