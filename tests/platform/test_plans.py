"""Plans belong to the platform: staff create, change and assign them (REST, ``manage.py plan``, the
admin), every change audited with who made it; tenants only read theirs (``GET quota/``)."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.models import AuditLog, Organization, Plan
from engine.control import MAX_DATASET_BYTES
from tests.platform.factories import PlanFactory, UserFactory

pytestmark = pytest.mark.django_db
PLANS = "/api/v1/plans/"


@pytest.fixture
def staff():
    return UserFactory(username="ops", is_staff=True)


def test_staff_create_change_and_assign_plans_over_rest(tenant, staff, session_client, token_client):
    client = session_client(staff)
    created = client.post(PLANS, {"name": "pro", "device_hours_per_month": 500, "max_concurrent_jobs": 4,
                                  "max_devices_per_job": 64, "weight": 3, "max_priority": "high"}, format="json")
    assert created.status_code == 201, created.json()
    plan = created.json()
    assert (plan["name"], plan["weight"], plan["max_concurrent_jobs"], plan["organization_count"]) == ("pro", 3.0, 4, 0)
    assigned = client.put(f"/api/v1/organizations/{tenant.organization.pk}/plan/", {"plan": "pro"}, format="json")
    assert assigned.status_code == 200, assigned.json()
    assert assigned.json()["plan"]["name"] == "pro"
    changed = client.patch(f"{PLANS}{plan['id']}/", {"weight": 2, "max_concurrent_jobs": None}, format="json")
    assert changed.status_code == 200, changed.json()
    assert (changed.json()["weight"], changed.json()["max_concurrent_jobs"], changed.json()["organization_count"]) == (
        2.0, None, 1)
    # the tenant sees it at once
    quota = token_client(tenant.viewer, tenant.organization).get("/api/v1/quota/").json()
    assert (quota["plan"], quota["weight"], quota["max_concurrent_jobs"]) == ("pro", 2.0, None)
    rows = [(r.organization_id, r.actor.username, r.action) for r in AuditLog.objects.order_by("id")
            if r.action.startswith("plan.")]
    org = tenant.organization.pk
    assert rows == [(None, "ops", "plan.created"), (org, "ops", "plan.assigned"), (None, "ops", "plan.changed"),
                    (org, "ops", "plan.changed")]
    listed = client.get(PLANS).json()["results"]
    assert [p["name"] for p in listed] == ["pro", "starter", "unlimited"]


def test_staff_set_the_upload_limits_the_tenant_sees(tenant, staff, session_client, token_client):
    client = session_client(staff)
    plan = client.post(PLANS, {"name": "big", "max_model_bytes": 10 * 2**30, "max_dataset_bytes": 2**20},
                       format="json").json()
    assert (plan["max_model_bytes"], plan["max_dataset_bytes"]) == (10 * 2**30, 2**20)
    client.put(f"/api/v1/organizations/{tenant.organization.pk}/plan/", {"plan": "big"}, format="json")
    quota = token_client(tenant.viewer, tenant.organization).get("/api/v1/quota/").json()
    assert (quota["max_model_bytes"], quota["max_dataset_bytes"]) == (10 * 2**30, 2**20)


@pytest.mark.parametrize(
    ("payload", "fields"),
    [({"name": "x", "weight": 0}, {"weight"}), ({"name": "x", "max_concurrent_jobs": 0}, {"max_concurrent_jobs"}),
     ({"name": "x", "max_priority": "urgent"}, {"max_priority"}), ({"name": "starter"}, {"name"}),
     ({"name": "bad name"}, {"name"}), ({"name": "x", "quota": 3}, {"quota"}),
     ({"name": "x", "max_model_bytes": 0}, {"max_model_bytes"}),
     ({"name": "x", "max_dataset_bytes": MAX_DATASET_BYTES + 1}, {"max_dataset_bytes"})],
    ids=["weight", "jobs", "priority", "taken", "slug", "unknown", "model-bytes", "dataset-bytes-over-the-engines"],
)
def test_bad_plans_answer_400_field_by_field_and_create_nothing(staff, session_client, payload, fields):
    before = (Plan.objects.count(), AuditLog.objects.count())
    response = session_client(staff).post(PLANS, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert (Plan.objects.count(), AuditLog.objects.count()) == before


def test_assigning_an_unknown_plan_or_organization_changes_nothing(tenant, staff, session_client):
    client = session_client(staff)
    assert client.put(f"/api/v1/organizations/{tenant.organization.pk}/plan/", {"plan": "nope"},
                      format="json").status_code == 400
    assert client.put("/api/v1/organizations/999999/plan/", {"plan": "starter"}, format="json").status_code == 404
    assert Organization.objects.get(pk=tenant.organization.pk).plan.name == "unlimited"


def test_plan_command_creates_sets_lists_and_assigns_with_the_staff_member_audited(tenant, staff):
    out = StringIO()
    call_command("plan", "create", "team", "--device-hours", "40", "--concurrent-jobs", "3", "--devices-per-job", "8",
                 "--weight", "2", "--by", "ops", stdout=out)
    assert out.getvalue().startswith("Plan team: device_hours_per_month=40")
    assert "max_concurrent_jobs=3, max_devices_per_job=8, weight=2, max_priority=normal" in out.getvalue()
    call_command("plan", "set", "team", "--device-hours", "unlimited", "--max-priority", "high", stdout=StringIO())
    plan = Plan.objects.get(name="team")
    assert (plan.device_hours_per_month, plan.max_concurrent_jobs, plan.max_priority) == (None, 3, "high")
    call_command("plan", "assign", "acme", "team", "--by", "ops", stdout=StringIO())
    assert Organization.objects.get(slug="acme").plan == plan
    row = AuditLog.objects.get(action="plan.assigned")
    assert (row.organization, row.actor, row.data) == (tenant.organization, staff, {"from": "unlimited", "to": "team"})
    listing = StringIO()
    call_command("plan", "list", stdout=listing)
    assert "Plan team:" in listing.getvalue()
    assert "(1 organizations)" in listing.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [(("assign", "acme", "nope"), "No plan named 'nope'"), (("assign", "nope", "starter"), "No organization"),
     (("set", "starter", "--weight", "0"), "weight"), (("create", "team", "--by", "acme-owner"), "not a staff user"),
     (("create", "starter"), "already exists")],
    ids=["plan", "organization", "weight", "not-staff", "taken"],
)
def test_plan_command_errors_are_one_line_with_status_2(tenant, args, message):
    with pytest.raises(CommandError) as error:
        call_command("plan", *args, stdout=StringIO())
    assert error.value.returncode == 2
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_admin_assigns_plans_through_the_services(tenant, staff, client):
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    plan = PlanFactory(name="gold", weight=4)
    response = client.post(f"/admin/accounts/organization/{tenant.organization.pk}/change/",
                           {"plan": plan.pk, "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    assert response.status_code == 302, response.content[:2000]
    assert Organization.objects.get(pk=tenant.organization.pk).plan == plan
    row = AuditLog.objects.get(action="plan.assigned")
    assert (row.actor, row.data["to"]) == (staff, "gold")
    edited = client.post(f"/admin/accounts/plan/{plan.pk}/change/",
                         {"description": "", "weight": "5", "max_priority": "normal",  # the form's fields, as shown
                          "max_model_bytes": plan.max_model_bytes, "max_dataset_bytes": plan.max_dataset_bytes})
    assert edited.status_code == 302, edited.content[:2000]
    assert Plan.objects.get(pk=plan.pk).weight == 5.0
    assert AuditLog.objects.filter(action="plan.changed", organization=tenant.organization, actor=staff).exists()


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_every_quota_onto_a_plan_with_the_same_limits():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, _after = ("accounts", "0002_organizations_tokens_quotas_audit"), ("accounts", "0003_plans")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    OldOrganization, Quota = old.get_model("accounts", "Organization"), old.get_model("accounts", "Quota")
    limits = {"a": (None, None, None), "b": (100, 2, 16), "c": (7, None, 4), "d": (None, None, None)}
    for slug, values in limits.items():
        org = OldOrganization.objects.create(name=slug, slug=slug)
        Quota.objects.create(organization=org, **dict(zip(Plan.LIMIT_FIELDS, values, strict=True)))
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    plans = {o.slug: o.plan.name for o in Organization.objects.select_related("plan")}
    assert plans == {"a": "legacy-unlimited", "b": "starter", "c": "legacy-c", "d": "legacy-unlimited"}
    legacy = Plan.objects.get(name="legacy-c")
    assert (legacy.device_hours_per_month, legacy.max_concurrent_jobs, legacy.max_devices_per_job) == (7, None, 4)
    assert not Plan.objects.get(name="starter").is_unlimited
