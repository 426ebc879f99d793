"""Services of the accounts app: the rules about owners, tokens and plans, and their audit rows."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken, AuditLog, Membership, Organization, Plan, Role, token_digest
from tests.platform.factories import PlanFactory, UserFactory

pytestmark = pytest.mark.django_db


def actions(organization) -> list[str]:
    return list(AuditLog.objects.filter(organization=organization).order_by("id").values_list("action", flat=True))


# --- organizations ------------------------------------------------------------------------------


def test_organization_create_makes_owner_plan_and_audit_row():
    staff, owner = UserFactory(is_staff=True), UserFactory()
    organization = services.organization_create(name="  Initech ", owner=owner, actor=staff)
    assert (organization.name, organization.slug) == ("Initech", "initech")
    assert Membership.objects.get(organization=organization).user == owner
    assert Membership.objects.get(organization=organization).role == Role.OWNER
    assert organization.plan.name == "starter"  # the default plan: every limit set
    assert not organization.plan.is_unlimited
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


# --- plans --------------------------------------------------------------------------------------


def test_plan_update_records_what_changed_in_each_organization_on_it(tenant, other_tenant):
    staff = UserFactory(username="ops", is_staff=True)
    plan = PlanFactory(name="team")
    for org in (tenant.organization, other_tenant.organization):
        services.plan_assign(organization=org, actor=staff, plan=plan)
    services.plan_update(plan=plan, actor=staff, device_hours_per_month=12.5, max_concurrent_jobs=3, weight=2)
    plan.refresh_from_db()
    assert (plan.device_hours_per_month, plan.max_concurrent_jobs, plan.weight) == (Decimal("12.5"), 3, 2.0)
    rows = AuditLog.objects.filter(action="plan.changed").order_by("organization_id")
    assert [(r.organization, r.actor) for r in rows] == [(tenant.organization, staff),
                                                        (other_tenant.organization, staff), (None, staff)]
    assert rows[0].data == {
        "device_hours_per_month": {"from": None, "to": "12.5"},
        "max_concurrent_jobs": {"from": None, "to": 3},
        "weight": {"from": 1.0, "to": 2},
    }
    services.plan_update(plan=plan, actor=staff, max_concurrent_jobs=3)  # no change, no row
    assert actions(tenant.organization).count("plan.changed") == 1


@pytest.mark.parametrize(
    "fields", [{"max_concurrent_jobs": -1}, {"device_hours_per_month": -0.5}, {"max_devices": 4}, {"weight": 0},
               {"max_priority": "urgent"}]
)
def test_plan_update_rejects_bad_values_and_changes_nothing(tenant, fields):
    plan = tenant.organization.plan
    with pytest.raises(ValidationError):
        services.plan_update(plan=plan, actor=None, **fields)
    plan.refresh_from_db()
    assert (plan.max_concurrent_jobs, plan.device_hours_per_month, plan.weight, plan.max_priority) == (
        None, None, 1.0, "high")
    assert not AuditLog.objects.filter(action="plan.changed").exists()


def test_only_staff_or_the_system_change_plans(tenant):
    plan = PlanFactory(name="pro")
    for call in (lambda: services.plan_create(actor=tenant.owner, name="mine"),
                 lambda: services.plan_update(plan=plan, actor=tenant.owner, weight=9),
                 lambda: services.plan_assign(organization=tenant.organization, plan=plan, actor=tenant.owner)):
        with pytest.raises(PermissionDenied):
            call()
    tenant.organization.refresh_from_db()
    assert (tenant.organization.plan.name, Plan.objects.get(name="pro").weight) == ("unlimited", 1.0)
    services.plan_assign(organization=tenant.organization, plan=plan, actor=None)  # the system may
    assert Organization.objects.get(pk=tenant.organization.pk).plan == plan


def test_organizations_start_on_the_configured_default_plan_which_must_limit_everything(settings):
    owner = UserFactory()
    PlanFactory(name="trial", device_hours_per_month=3, max_concurrent_jobs=1, max_devices_per_job=2)
    settings.PLEXRL_DEFAULT_PLAN = "trial"
    assert services.organization_create(name="A", owner=owner).plan.name == "trial"
    PlanFactory(name="open")  # no limits
    settings.PLEXRL_DEFAULT_PLAN = "open"
    with pytest.raises(ValidationError, match="leaves a limit unlimited"):
        services.organization_create(name="B", owner=owner)
    settings.PLEXRL_DEFAULT_PLAN = "missing"
    with pytest.raises(ValidationError, match="does not exist"):
        services.organization_create(name="C", owner=owner)
    assert list(Organization.objects.filter(name__in=["B", "C"])) == []
