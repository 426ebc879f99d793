"""Services of the accounts app: the rules about owners, tokens and quotas, and their audit rows."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, AuditLog, Membership, Organization, Quota, Role, token_digest
from tests.platform.factories import UserFactory

pytestmark = pytest.mark.django_db


def actions(organization) -> list[str]:
    return list(AuditLog.objects.filter(organization=organization).order_by("id").values_list("action", flat=True))


# --- organizations ------------------------------------------------------------------------------


def test_organization_create_makes_owner_quota_and_audit_row():
    staff, owner = UserFactory(is_staff=True), UserFactory()
    organization = services.organization_create(name="  Initech ", owner=owner, actor=staff)
    assert (organization.name, organization.slug) == ("Initech", "initech")
    assert Membership.objects.get(organization=organization).user == owner
    assert Membership.objects.get(organization=organization).role == Role.OWNER
    quota = Quota.objects.get(organization=organization)
    assert (quota.device_hours_per_month, quota.max_concurrent_jobs, quota.max_devices_per_job) == (None, None, None)
    row = AuditLog.objects.get(organization=organization)
    assert (row.action, row.actor, row.data["owner"]) == ("organization.created", staff, owner.username)


@pytest.mark.parametrize(
    ("name", "slug", "field"),
    [("Acme", "", "name"), ("Acme Two", "acme", "slug"), ("   ", "", "name"), ("!!!", "", "slug")],
    ids=["taken-name", "taken-slug", "blank-name", "name-without-slug"],
)
def test_organization_create_rejects_taken_or_empty_names(tenant, name, slug, field):
    with pytest.raises(ValidationError) as error:
        services.organization_create(name=name, slug=slug, owner=tenant.owner)
    assert field in error.value.message_dict
    assert Organization.objects.count() == 1


# --- members ------------------------------------------------------------------------------------


def test_member_add_writes_an_audit_row(tenant):
    newcomer = UserFactory()
    membership = services.member_add(organization=tenant.organization, actor=tenant.admin, user=newcomer, role="viewer")
    assert membership.role == Role.VIEWER
    row = AuditLog.objects.get(organization=tenant.organization, action="member.added")
    assert (row.actor, row.target, row.data["role"]) == (tenant.admin, newcomer.username, "viewer")


def test_only_owners_add_owners(tenant):
    newcomer = UserFactory()
    with pytest.raises(PermissionDenied, match="Only owners"):
        services.member_add(organization=tenant.organization, actor=tenant.admin, user=newcomer, role=Role.OWNER)
    assert not Membership.objects.filter(user=newcomer).exists()
    services.member_add(organization=tenant.organization, actor=tenant.owner, user=newcomer, role=Role.OWNER)
    assert Membership.objects.get(user=newcomer).role == Role.OWNER


def test_member_add_twice_is_an_error(tenant):
    with pytest.raises(ValidationError, match="already a member"):
        services.member_add(organization=tenant.organization, actor=None, user=tenant.viewer, role=Role.ADMIN)


def test_the_last_owner_cannot_be_demoted_or_removed(tenant):
    org = tenant.organization
    with pytest.raises(ValidationError, match="last owner"):
        services.member_set_role(organization=org, actor=tenant.owner, user=tenant.owner, role=Role.ADMIN)
    with pytest.raises(ValidationError, match="last owner"):
        services.member_remove(organization=org, actor=tenant.owner, user=tenant.owner)
    with pytest.raises(ValidationError, match="last owner"):
        services.member_remove(organization=org, actor=None, user=tenant.owner)  # not even the system
    assert Membership.objects.get(organization=org, user=tenant.owner).role == Role.OWNER
    # With a second owner the first may step down.
    services.member_set_role(organization=org, actor=tenant.owner, user=tenant.admin, role=Role.OWNER)
    services.member_set_role(organization=org, actor=tenant.owner, user=tenant.owner, role=Role.MEMBER)
    assert list(Membership.objects.filter(organization=org, role=Role.OWNER).values_list("user", flat=True)) == [
        tenant.admin.pk
    ]


def test_admins_cannot_grant_or_take_the_owner_role(tenant):
    org = tenant.organization
    with pytest.raises(PermissionDenied):
        services.member_set_role(organization=org, actor=tenant.admin, user=tenant.member, role=Role.OWNER)
    services.member_set_role(organization=org, actor=tenant.owner, user=tenant.member, role=Role.OWNER)
    with pytest.raises(PermissionDenied):
        services.member_set_role(organization=org, actor=tenant.admin, user=tenant.member, role=Role.VIEWER)
    with pytest.raises(PermissionDenied):
        services.member_remove(organization=org, actor=tenant.admin, user=tenant.member)
    assert Membership.objects.get(organization=org, user=tenant.member).role == Role.OWNER


def test_member_set_role_records_from_and_to(tenant):
    services.member_set_role(organization=tenant.organization, actor=tenant.admin, user=tenant.member, role="viewer")
    row = AuditLog.objects.get(action="member.role_changed")
    assert row.data == {"user_id": tenant.member.pk, "from": "member", "to": "viewer"}
    # Setting the same role again changes nothing and records nothing.
    services.member_set_role(organization=tenant.organization, actor=tenant.admin, user=tenant.member, role="viewer")
    assert AuditLog.objects.filter(action="member.role_changed").count() == 1


def test_member_remove_revokes_their_tokens_there(tenant, other_tenant):
    services.member_add(organization=other_tenant.organization, actor=None, user=tenant.member, role=Role.MEMBER)
    here, _ = services.token_create(user=tenant.member, organization=tenant.organization, name="here")
    there, _ = services.token_create(user=tenant.member, organization=other_tenant.organization, name="there")
    services.member_remove(organization=tenant.organization, actor=tenant.admin, user=tenant.member)
    assert not Membership.objects.filter(organization=tenant.organization, user=tenant.member).exists()
    here.refresh_from_db()
    there.refresh_from_db()
    assert here.revoked_at is not None
    assert there.revoked_at is None  # the other organization's token is not this one's business
    row = AuditLog.objects.get(organization=tenant.organization, action="member.removed")
    assert row.data["tokens_revoked"] == 1


def test_audit_rows_share_the_transaction_of_the_change(tenant, monkeypatch):
    def broken_audit(**kwargs):
        raise RuntimeError("audit table unavailable")

    monkeypatch.setattr(services, "audit_record", broken_audit)
    newcomer = UserFactory()
    with pytest.raises(RuntimeError):
        services.member_add(organization=tenant.organization, actor=tenant.owner, user=newcomer, role=Role.MEMBER)
    assert not Membership.objects.filter(user=newcomer).exists()  # rolled back with the failed audit row
    with pytest.raises(RuntimeError):
        services.token_create(user=tenant.member, organization=tenant.organization, name="x")
    assert not ApiToken.objects.exists()


# --- tokens -------------------------------------------------------------------------------------


def test_token_create_stores_only_the_digest(tenant):
    token, plaintext = services.token_create(
        user=tenant.member, organization=tenant.organization, name="ci", expires_in_days=30
    )
    assert plaintext.startswith("plx_")
    stored = ApiToken.objects.get(pk=token.pk)
    assert stored.digest == token_digest(plaintext)
    assert stored.prefix == plaintext[:12]
    assert plaintext not in {str(value) for value in ApiToken.objects.values().get(pk=token.pk).values()}
    assert timedelta(days=29) < stored.expires_at - timezone.now() <= timedelta(days=30)
    row = AuditLog.objects.get(action="token.created")
    assert plaintext not in str(row.data)
    assert row.target == stored.prefix


def test_tokens_are_only_for_members(tenant, other_tenant):
    with pytest.raises(ValidationError, match="not a member"):
        services.token_create(user=tenant.member, organization=other_tenant.organization, name="x")
    with pytest.raises(ValidationError):
        services.token_create(user=tenant.member, organization=tenant.organization, name="x", expires_in_days=0)
    assert not ApiToken.objects.exists()


def test_token_revoke_by_owner_of_token_or_admin_only(tenant):
    token, _ = services.token_create(user=tenant.member, organization=tenant.organization, name="x")
    with pytest.raises(PermissionDenied):
        services.token_revoke(token=token, actor=tenant.viewer)
    revoked = services.token_revoke(token=token, actor=tenant.admin)
    assert revoked.revoked_at is not None
    first = revoked.revoked_at
    assert services.token_revoke(token=token, actor=tenant.member).revoked_at == first  # already revoked
    assert actions(tenant.organization).count("token.revoked") == 1


# --- quotas -------------------------------------------------------------------------------------


def test_quota_set_records_what_changed(tenant):
    org = tenant.organization
    quota = services.quota_set(organization=org, actor=tenant.admin, device_hours_per_month=12.5, max_concurrent_jobs=3)
    assert (quota.device_hours_per_month, quota.max_concurrent_jobs) == (Decimal("12.5"), 3)
    row = AuditLog.objects.get(action="quota.changed")
    assert row.data == {
        "device_hours_per_month": {"from": None, "to": "12.5"},
        "max_concurrent_jobs": {"from": None, "to": 3},
    }
    services.quota_set(organization=org, actor=tenant.admin, max_concurrent_jobs=3)  # no change, no row
    services.quota_set(organization=org, actor=tenant.admin, max_concurrent_jobs=None)  # back to unlimited
    assert actions(org).count("quota.changed") == 2
    assert Quota.objects.get(organization=org).max_concurrent_jobs is None


@pytest.mark.parametrize(
    "fields", [{"max_concurrent_jobs": -1}, {"device_hours_per_month": -0.5}, {"max_devices": 4}]
)
def test_quota_set_rejects_negative_or_unknown_limits(tenant, fields):
    with pytest.raises(ValidationError):
        services.quota_set(organization=tenant.organization, actor=tenant.admin, **fields)
    quota = Quota.objects.get(organization=tenant.organization)
    assert (quota.max_concurrent_jobs, quota.device_hours_per_month) == (None, None)
    assert "quota.changed" not in actions(tenant.organization)
