"""Selectors of the accounts app: each returns its tenant's rows and never another's."""

import pytest

from accounts import selectors, services
from accounts.models import AuditLog, Role
from tests.platform.factories import AuditLogFactory, MembershipFactory, PlanFactory

pytestmark = pytest.mark.django_db


def test_members_of_returns_only_the_organization_members(tenant, other_tenant):
    members = selectors.members_of(organization=tenant.organization)
    assert {m.user.username for m in members} == {"acme-owner", "acme-admin", "acme-member", "acme-viewer"}
    assert all(m.organization_id == tenant.organization.pk for m in members)


def test_tokens_for_and_tokens_of_stay_in_their_organization(tenant, other_tenant):
    MembershipFactory(user=tenant.member, organization=other_tenant.organization)
    mine, _ = services.token_create(user=tenant.member, organization=tenant.organization, name="mine")
    services.token_create(user=tenant.member, organization=other_tenant.organization, name="elsewhere")
    colleague, _ = services.token_create(user=tenant.admin, organization=tenant.organization, name="colleague")
    services.token_create(user=other_tenant.admin, organization=other_tenant.organization, name="theirs")

    assert list(selectors.tokens_for(user=tenant.member, organization=tenant.organization)) == [mine]
    assert set(selectors.tokens_of(organization=tenant.organization)) == {mine, colleague}


def test_audit_of_is_newest_first_and_excludes_other_tenants(tenant, other_tenant):
    first = AuditLogFactory(organization=tenant.organization)
    AuditLogFactory(organization=other_tenant.organization)
    second = AuditLogFactory(organization=tenant.organization)
    assert list(selectors.audit_of(organization=tenant.organization)) == [second, first]
    assert AuditLog.objects.count() == 3


def test_quota_of_and_usage_stay_in_their_organization(tenant, other_tenant):
    services.plan_assign(organization=other_tenant.organization, actor=None,
                         plan=PlanFactory(name="one-job", max_concurrent_jobs=1))
    assert selectors.quota_of(organization=tenant.organization).max_concurrent_jobs is None
    assert selectors.quota_of(organization=other_tenant.organization).max_concurrent_jobs == 1
    usage = selectors.quota_usage(organization=tenant.organization)
    assert set(usage) == {"device_hours_this_month", "over_budget_device_hours", "concurrent_jobs", "queued_jobs"}


def test_organizations_of_lists_the_users_organizations_with_roles(tenant, other_tenant):
    MembershipFactory(user=tenant.admin, organization=other_tenant.organization, role=Role.VIEWER)
    rows = [(o.slug, o.role) for o in selectors.organizations_of(user=tenant.admin)]
    assert rows == [("acme", "admin"), ("globex", "viewer")]
    assert [o.slug for o in selectors.organizations_of(user=tenant.viewer)] == ["acme"]


def test_membership_lookups(tenant, other_tenant):
    assert selectors.membership_of(user=tenant.viewer, organization=other_tenant.organization) is None
    assert selectors.membership_of(user=tenant.viewer, organization=tenant.organization.pk).role == Role.VIEWER
    MembershipFactory(user=tenant.viewer, organization=other_tenant.organization)
    assert selectors.first_membership_of(user=tenant.viewer).organization == tenant.organization


def _as_orm_reads_it(token):
    """The token, user, organization and membership as plain field values, read by querysets."""
    from accounts.models import ApiToken, Membership

    orm = ApiToken.objects.select_related("user", "organization").get(pk=token.pk)
    member = Membership.objects.filter(user=orm.user, organization=orm.organization).first()
    return [_fields(orm), _fields(orm.user), _fields(orm.organization), member and _fields(member)]


def _fields(instance):
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def test_token_by_digest_builds_what_the_orm_builds(tenant, other_tenant):
    """The fixed-SQL token read (``accounts.sql``) gives the instances querysets give, field for field
    (aware datetimes, booleans), with the membership; a user no longer a member there has none."""
    from django.utils import timezone

    from accounts.models import ApiToken, token_digest

    made, plaintext = services.token_create(user=tenant.admin, organization=tenant.organization, name="t",
                                            expires_in_days=3)
    ApiToken.objects.filter(pk=made.pk).update(last_used_at=timezone.now())
    token = selectors.token_by_digest(digest=token_digest(plaintext))
    read = [_fields(token), _fields(token.user), _fields(token.organization), _fields(token.membership)]
    assert read == _as_orm_reads_it(made)
    assert token.expires_at.tzinfo is not None
    assert token.user.is_active is True
    assert token.membership.role == Role.ADMIN
    assert token.membership.organization is token.organization

    MembershipFactory(user=tenant.viewer, organization=other_tenant.organization)
    elsewhere, plaintext = services.token_create(user=tenant.viewer, organization=other_tenant.organization,
                                                 name="e")
    from accounts.models import Membership

    Membership.objects.filter(user=tenant.viewer, organization=other_tenant.organization).delete()
    token = selectors.token_by_digest(digest=token_digest(plaintext))
    assert token.pk == elsewhere.pk
    assert token.membership is None
    assert selectors.token_by_digest(digest=token_digest("plx_nothing")) is None


# Run in a fresh process on SQLite (the embedded default), where datetimes and booleans arrive as text
# and integers and only the converters make them what the ORM gives.
_SQLITE_CHECK = """

from accounts import selectors, services
from accounts.models import ApiToken, User, token_digest
user = User.objects.create_user("u", password="pw-12345678")
org = services.organization_create(name="Org", owner=user)
made, plaintext = services.token_create(user=user, organization=org, name="t",
                                        expires_in_days=3)
token = selectors.token_by_digest(digest=token_digest(plaintext))
orm = ApiToken.objects.select_related("user", "organization").get(pk=made.pk)
fields = lambda o: {f.attname: getattr(o, f.attname) for f in o._meta.concrete_fields}
assert fields(token) == fields(orm), (fields(token), fields(orm))
assert fields(token.user) == fields(orm.user) and fields(token.organization) == fields(orm.organization)
assert token.membership.role == "owner" and token.expires_at.tzinfo is not None
print("same")
"""


def test_token_by_digest_builds_what_the_orm_builds_on_sqlite(manage):
    assert manage("migrate", "-v", "0").returncode == 0
    result = manage("shell", "-c", _SQLITE_CHECK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("same")
