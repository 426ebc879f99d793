"""Selectors of the accounts app: each returns its tenant's rows and never another's."""

import pytest

from accounts import selectors, services
from accounts.models import AuditLog, Role
from tests.platform.factories import AuditLogFactory, MembershipFactory

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
    services.quota_set(organization=other_tenant.organization, actor=None, max_concurrent_jobs=1)
    assert selectors.quota_of(organization=tenant.organization).max_concurrent_jobs is None
    assert selectors.quota_of(organization=other_tenant.organization).max_concurrent_jobs == 1
    usage = selectors.quota_usage(organization=tenant.organization)
    assert set(usage) == {"device_hours_this_month", "over_budget_device_hours", "concurrent_jobs"}


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
