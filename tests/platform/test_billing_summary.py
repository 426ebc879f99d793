"""Monthly billing reports: an organization's summary, and the cluster's report with the idle row.

Capacity comes from ``CapacitySample`` rows (recorded by ``billing.tasks.record_capacity``): a step
function, each sample holding until the next; the latest holds until now but at most two sampling
periods (``BILLING_CAPACITY_PERIOD_S``). Usage counts by call start time within the calendar month
(UTC). Idle = capacity - billed: device time nobody used is the platform's row, never the users'.
"""

import csv
import datetime as dt
import io

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import selectors, tasks
from billing.models import CapacitySample
from jobs import ingest, services
from jobs.models import Job
from tests.platform.factories import UserFactory

pytestmark = pytest.mark.django_db

SUMMARY = "/api/v1/billing/summary/"
CLUSTER = "/api/v1/billing/cluster/"
HOUR = 3600.0

T0 = dt.datetime(2025, 3, 10, tzinfo=dt.UTC)  # a past month: "now" is long after it
MARCH = dt.date(2025, 3, 1)


def ts(when: dt.datetime) -> float:
    return when.timestamp()


def make_job(tenant, *, name="run", rollout_devices=1, train_devices=1) -> Job:
    return services.job_create(organization=tenant.organization, user=tenant.member, spec={"task": "arith", "steps": 3},
                               name=name, rollout_devices=rollout_devices, train_devices=train_devices)  # fmt: skip


def run(job, *calls):
    """Ingest the job's log: it ran and made ``calls`` (dicts of call, start, end, devices, wpg)."""
    events = [{"seq": 1, "kind": "state", "ts": 1.0, "data": {"state": "running"}}]
    for i, c in enumerate(calls):
        data = {"job": job.engine_id, "role": "policy", "fn": "generate", "wpg": c.get("wpg", "w0"),
                "devices": c.get("devices", 1.0), "start": c["start"], "end": c["end"], "setup_s": 0.0,
                "exec_s": c["end"] - c["start"], "call": c["call"], "tenant": "", "queued_s": 0.0}  # fmt: skip
        events.append({"seq": i + 2, "kind": "usage", "ts": c["end"], "data": data})
    ingest.ingest_events(job=job, events=events)
    job.refresh_from_db()
    return job


def sample(at: dt.datetime, devices: float) -> CapacitySample:
    return CapacitySample.objects.create(at=at, devices=devices, groups=[])


@pytest.fixture
def staff(db):
    """Platform staff, member of no organization."""
    return UserFactory(username="ops", is_staff=True)


@pytest.fixture
def march(tenant, other_tenant):
    """acme: job a (two calls, one on two groups) and b in March, plus a call in April;
    globex: one call in March. Capacity: 4 devices at T0 and at T0 + 1 h."""
    a = run(make_job(tenant, name="a"),
            {"call": 1, "start": ts(T0), "end": ts(T0) + 2700, "devices": 2.0},  # 1.5 device-hours
            {"call": 2, "start": ts(T0) + 100, "end": ts(T0) + 280, "wpg": "w0"},
            {"call": 2, "start": ts(T0) + 100, "end": ts(T0) + 280, "wpg": "w1"})  # fmt: skip
    b = run(make_job(tenant, name="b"), {"call": 1, "start": ts(T0) + 10, "end": ts(T0) + 10 + HOUR / 2},
            {"call": 2, "start": ts(dt.datetime(2025, 4, 1, tzinfo=dt.UTC)), "end": ts(T0) + 40 * 86400})  # fmt: skip
    theirs = run(make_job(other_tenant, name="theirs"), {"call": 1, "start": ts(T0) + 5, "end": ts(T0) + 5 + HOUR})
    sample(T0, 4)
    sample(T0 + dt.timedelta(hours=1), 4)
    return {"a": a, "b": b, "theirs": theirs}


def read_csv(response) -> list[list[str]]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))


# --- the organization's summary -----------------------------------------------------------------


def test_summary_counts_this_organizations_month_only(tenant, token_client, march):
    response = token_client(tenant.viewer, tenant.organization).get(SUMMARY, {"month": "2025-03"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"month", "device_hours", "calls", "redone_device_hours", "jobs"}
    assert body["month"] == "2025-03"
    # a: 1.5 + 2 x 180 s; b: 0.5 (its April call is April's); globex's hour is not ours
    assert body["device_hours"] == pytest.approx(1.5 + 360 / HOUR + 0.5)
    assert body["calls"] == 3  # call 2 of a held two groups: one call
    assert [(j["job"], j["name"]) for j in body["jobs"]] == [(march["a"].pk, "a"), (march["b"].pk, "b")]
    a = body["jobs"][0]
    assert set(a) == {"job", "name", "device_hours", "calls", "redone_device_hours"}
    assert (a["device_hours"], a["calls"]) == (pytest.approx(1.5 + 360 / HOUR), 2)
    assert "theirs" not in response.content.decode()


def test_summary_sums_in_the_database(tenant, march):
    """One query, grouped by job: the month's ledger rows never travel to the web process (the
    summary took ~50 ms for 8000 rows when they did)."""
    with CaptureQueriesContext(connection) as queries:
        summary = selectors.monthly_summary(organization=tenant.organization, month=MARCH)
    assert summary["calls"] == 3
    assert len(queries) == 1
    assert "GROUP BY" in queries[0]["sql"]


def test_summary_of_the_other_tenant(other_tenant, token_client, march):
    body = token_client(other_tenant.viewer, other_tenant.organization).get(SUMMARY, {"month": "2025-03"}).json()
    assert body["device_hours"] == pytest.approx(1.0)
    assert [j["job"] for j in body["jobs"]] == [march["theirs"].pk]


def test_summary_of_the_next_month(tenant, token_client, march):
    body = token_client(tenant.viewer, tenant.organization).get(SUMMARY, {"month": "2025-04"}).json()
    assert [j["job"] for j in body["jobs"]] == [march["b"].pk]
    assert body["calls"] == 1


def test_summary_defaults_to_the_current_month(tenant, token_client, march):
    body = token_client(tenant.viewer, tenant.organization).get(SUMMARY).json()
    now = dt.datetime.now(dt.UTC)
    assert body == {"month": f"{now.year:04d}-{now.month:02d}", "device_hours": 0.0, "calls": 0,
                    "redone_device_hours": 0.0, "jobs": []}
    # an empty ?month= (a form's blank field) is the default too
    assert token_client(tenant.viewer, tenant.organization).get(SUMMARY, {"month": ""}).json() == body


BAD_MONTHS = ["2025-13", "2025-00", "2025-3", "25-03", "2025/03", "march", "1969-12", "9999-01", " 2025-03"]


@pytest.mark.parametrize("month", BAD_MONTHS)
@pytest.mark.parametrize("url", [SUMMARY, CLUSTER])
def test_a_bad_month_is_a_field_error(tenant, token_client, session_client, staff, url, month):
    client = token_client(tenant.viewer, tenant.organization) if url == SUMMARY else session_client(staff)
    response = client.get(url, {"month": month})
    assert response.status_code == 400
    assert set(response.json()) == {"month"}


def test_summary_needs_authentication_and_an_organization(api_client, session_client, staff):
    assert api_client.get(SUMMARY).status_code == 401
    assert session_client(staff).get(SUMMARY).status_code == 403  # staff, but no organization


def test_summary_as_csv(tenant, token_client, march):
    client = token_client(tenant.viewer, tenant.organization)
    rows = read_csv(client.get(SUMMARY, {"month": "2025-03", "format": "csv"}))
    assert rows[0] == ["job", "name", "device_hours", "calls", "redone_device_hours"]
    assert [(int(r[0]), r[1], int(r[3])) for r in rows[1:]] == [(march["a"].pk, "a", 2), (march["b"].pk, "b", 1)]
    assert float(rows[1][2]) == pytest.approx(1.5 + 360 / HOUR)
    assert read_csv(client.get(SUMMARY, {"month": "2024-01", "format": "csv"})) == [rows[0]]


# --- capacity -----------------------------------------------------------------------------------


def test_capacity_is_a_step_function_whose_last_sample_holds_two_periods(db):
    period = settings.BILLING_CAPACITY_PERIOD_S
    sample(T0, 4)
    sample(T0 + dt.timedelta(hours=1), 6)
    lo, hi = selectors._month_window(MARCH)
    later = T0 + dt.timedelta(days=1)
    # 4 devices for the hour, then the last sample's 6 for two periods (the engine went quiet)
    assert selectors.capacity_device_hours(lo=lo, hi=hi, now=later) == pytest.approx((4 * HOUR + 6 * 2 * period) / HOUR)
    # shortly after the last sample: it holds until now only
    soon = T0 + dt.timedelta(hours=1, seconds=30)
    assert selectors.capacity_device_hours(lo=lo, hi=hi, now=soon) == pytest.approx((4 * HOUR + 6 * 30) / HOUR)
    # nothing counts after now
    mid = T0 + dt.timedelta(minutes=30)
    assert selectors.capacity_device_hours(lo=lo, hi=hi, now=mid) == pytest.approx(2.0)
    assert selectors.capacity_device_hours(lo=lo, hi=hi, now=T0 - dt.timedelta(days=1)) == 0.0


def test_capacity_splits_at_month_boundaries(db):
    period = settings.BILLING_CAPACITY_PERIOD_S
    sample(dt.datetime(2025, 2, 28, 23, 0, tzinfo=dt.UTC), 2)  # February's last sample carries into March
    sample(dt.datetime(2025, 3, 1, 0, 30, tzinfo=dt.UTC), 4)
    sample(dt.datetime(2025, 3, 31, 23, 59, tzinfo=dt.UTC), 8)
    sample(dt.datetime(2025, 4, 1, 0, 1, tzinfo=dt.UTC), 8)
    now = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
    feb = selectors._month_window(dt.date(2025, 2, 1))
    mar = selectors._month_window(MARCH)
    apr = selectors._month_window(dt.date(2025, 4, 1))
    assert selectors.capacity_device_hours(lo=feb[0], hi=feb[1], now=now) == pytest.approx(2.0)
    march_seconds = 2 * 1800 + 4 * (ts(dt.datetime(2025, 3, 31, 23, 59, tzinfo=dt.UTC)) - ts(
        dt.datetime(2025, 3, 1, 0, 30, tzinfo=dt.UTC))) + 8 * 60  # fmt: skip
    assert selectors.capacity_device_hours(lo=mar[0], hi=mar[1], now=now) == pytest.approx(march_seconds / HOUR)
    assert selectors.capacity_device_hours(lo=apr[0], hi=apr[1], now=now) == pytest.approx(
        (8 * 60 + 8 * 2 * period) / HOUR)


def test_usage_counts_by_call_start_across_the_month_boundary(tenant):
    end_of_march = ts(dt.datetime(2025, 4, 1, tzinfo=dt.UTC))
    run(make_job(tenant), {"call": 1, "start": end_of_march - 1800, "end": end_of_march + 1800},
        {"call": 2, "start": end_of_march, "end": end_of_march + 360})  # fmt: skip
    march = selectors.monthly_summary(organization=tenant.organization, month=MARCH)
    april = selectors.monthly_summary(organization=tenant.organization, month=dt.date(2025, 4, 1))
    assert (march["device_hours"], march["calls"]) == (pytest.approx(1.0), 1)
    assert (april["device_hours"], april["calls"]) == (pytest.approx(0.1), 1)


# --- the cluster report (platform staff) --------------------------------------------------------


def test_cluster_idle_is_capacity_less_billed(db, tenant):
    # 4 devices from T0 for the hour to the next sample, which holds two periods (now is long after)
    sample(T0, 4)
    sample(T0 + dt.timedelta(hours=1), 4)
    run(make_job(tenant), {"call": 1, "start": ts(T0), "end": ts(T0) + 2700, "devices": 2.0})  # 1.5 device-hours
    report = selectors.cluster_summary(month=MARCH, now=T0 + dt.timedelta(days=2))
    capacity = 4 * (HOUR + 2 * settings.BILLING_CAPACITY_PERIOD_S) / HOUR  # 4.1333...
    assert report["capacity_device_hours"] == pytest.approx(capacity)
    assert report["billed_device_hours"] == pytest.approx(1.5)
    assert report["idle_device_hours"] == pytest.approx(capacity - 1.5)
    assert (report["over_capacity"], report["over_capacity_device_hours"]) == (False, 0.0)


def test_cluster_flags_billing_over_capacity(db, tenant):
    run(make_job(tenant), {"call": 1, "start": ts(T0), "end": ts(T0) + HOUR})  # no capacity sample at all
    report = selectors.cluster_summary(month=MARCH)
    assert report["capacity_device_hours"] == 0.0
    assert report["idle_device_hours"] == 0.0  # never negative ...
    assert report["over_capacity"] is True  # ... but said so
    assert report["over_capacity_device_hours"] == pytest.approx(1.0)


def test_cluster_report_for_staff(session_client, staff, tenant, other_tenant, march):
    response = session_client(staff).get(CLUSTER, {"month": "2025-03"})
    assert response.status_code == 200
    body = response.json()
    capacity = 4 * (HOUR + 2 * settings.BILLING_CAPACITY_PERIOD_S) / HOUR
    acme = 1.5 + 360 / HOUR + 0.5
    assert body["month"] == "2025-03"
    assert body["capacity_device_hours"] == pytest.approx(capacity)
    assert body["billed_device_hours"] == pytest.approx(acme + 1.0)
    assert body["idle_device_hours"] == pytest.approx(capacity - acme - 1.0)
    assert body["over_capacity"] is False
    orgs = {o["name"]: o for o in body["organizations"]}
    assert set(orgs) == {"Acme", "Globex"}
    assert orgs["Acme"]["organization"] == tenant.organization.pk
    assert orgs["Acme"]["device_hours"] == pytest.approx(acme)
    assert orgs["Acme"]["jobs"] == 2
    # globex: 1 device for its hour, 2 reserved for that hour alone
    globex = orgs["Globex"]
    assert (globex["device_hours"], globex["counterfactual_device_hours"]) == (pytest.approx(1.0), pytest.approx(2.0))
    assert globex["savings"] == pytest.approx(0.5)


def test_cluster_savings_match_the_organizations_savings_report(tenant, token_client, session_client, staff):
    # All of a's usage in one month: the month's savings equal the all-time report's totals.
    run(make_job(tenant, rollout_devices=2), {"call": 1, "start": ts(T0), "end": ts(T0) + 60},
        {"call": 2, "start": ts(T0) + 120, "end": ts(T0) + 180})  # fmt: skip
    totals = token_client(tenant.viewer, tenant.organization).get("/api/v1/billing/savings/").json()["totals"]
    row = session_client(staff).get(CLUSTER, {"month": "2025-03"}).json()["organizations"][0]
    assert row["device_hours"] == pytest.approx(totals["billed_device_hours"])
    assert row["counterfactual_device_hours"] == pytest.approx(totals["counterfactual_device_hours"])
    assert row["savings"] == pytest.approx(totals["savings"])


@pytest.mark.parametrize("role", ["owner", "admin", "viewer"])
def test_cluster_report_is_staff_only(tenant, token_client, march, role):
    response = token_client(tenant.user(role), tenant.organization).get(CLUSTER)
    assert response.status_code == 403
    assert "Globex" not in response.content.decode()


def test_cluster_report_needs_authentication(api_client):
    assert api_client.get(CLUSTER).status_code == 401


def test_staff_in_an_organization_see_the_whole_cluster(tenant, token_client, march):
    tenant.owner.is_staff = True
    tenant.owner.save(update_fields=["is_staff"])
    body = token_client(tenant.owner, tenant.organization).get(CLUSTER, {"month": "2025-03"}).json()
    assert {o["name"] for o in body["organizations"]} == {"Acme", "Globex"}


def test_cluster_report_as_csv(session_client, staff, march):
    rows = read_csv(session_client(staff).get(CLUSTER, {"month": "2025-03", "format": "csv"}))
    assert rows[0] == ["kind", "organization", "name", "device_hours", "counterfactual_device_hours", "savings"]
    assert [(r[0], r[2]) for r in rows[1:]] == [("organization", "Acme"), ("organization", "Globex"), ("idle", "idle")]
    idle = rows[-1]
    assert (idle[1], idle[4], idle[5]) == ("", "", "")
    capacity = 4 * (HOUR + 2 * settings.BILLING_CAPACITY_PERIOD_S) / HOUR
    # the rows add up to the capacity: every device-hour is someone's, or the platform's idle
    assert sum(float(r[3]) for r in rows[1:]) == pytest.approx(capacity)


def test_cluster_csv_over_capacity_has_its_own_row(session_client, staff, tenant):
    run(make_job(tenant), {"call": 1, "start": ts(T0), "end": ts(T0) + HOUR})
    rows = read_csv(session_client(staff).get(CLUSTER, {"month": "2025-03", "format": "csv"}))
    assert [(r[0], r[2], float(r[3])) for r in rows[1:]] == [
        ("organization", "Acme", pytest.approx(1.0)), ("idle", "idle", 0.0),
        ("over_capacity", "over_capacity", pytest.approx(1.0))]  # fmt: skip


def test_cluster_report_of_an_empty_month(session_client, staff):
    body = session_client(staff).get(CLUSTER, {"month": "2024-02"}).json()
    assert body == {"month": "2024-02", "capacity_device_hours": 0.0, "billed_device_hours": 0.0,
                    "redone_device_hours": 0.0, "idle_device_hours": 0.0, "over_capacity": False,
                    "over_capacity_device_hours": 0.0,
                    "organizations": []}  # fmt: skip


# --- recording capacity -------------------------------------------------------------------------


class FakeEngine:
    """Stands in for the remote engine: only ``cluster_snapshot``."""

    def __init__(self, groups):
        self.groups = groups

    def cluster_snapshot(self):
        return {"groups": self.groups, "jobs": {}, "scheduler": {}}


def test_record_capacity_stores_the_snapshots_devices(db, monkeypatch):
    groups = [
        {"name": "policy-vllm-0", "side": "rollout", "backend": "vllm", "ranks": 2, "devices": 2, "max_resident": 2},
        {"name": "train-fsdp-0", "side": "train", "backend": "fsdp", "ranks": 4, "devices": 4, "max_resident": 1},
    ]
    monkeypatch.setattr("jobs.engine.engine", lambda: FakeEngine(groups))
    assert tasks.record_capacity() == 6.0
    recorded = CapacitySample.objects.get()
    assert recorded.devices == 6.0
    assert recorded.groups == groups
    assert abs((dt.datetime.now(dt.UTC) - recorded.at).total_seconds()) < 60
    monkeypatch.setattr("jobs.engine.engine", lambda: FakeEngine([]))
    assert tasks.record_capacity() == 0.0  # no groups: a sample of nothing, not a gap
    assert CapacitySample.objects.count() == 2


def test_record_capacity_runs_every_period():
    entry = settings.CELERY_BEAT_SCHEDULE["record-capacity"]
    assert entry == {"task": "billing.tasks.record_capacity", "schedule": settings.BILLING_CAPACITY_PERIOD_S}
    assert {"pull-job-events", "enforce-quotas"} <= set(settings.CELERY_BEAT_SCHEDULE)


# --- work an engine recovery redid ----------------------------------------------------------------


def test_work_a_recovery_redid_is_on_the_ledger_and_not_billed(tenant, token_client, session_client, staff):
    """A driver died after its checkpoint (seq 3) and one more hour's call; the engine resumed from
    the checkpoint (``recovery``, seq 5) and did that call again. The lost hour stays on the ledger
    as ``redone``: the tenant pays for the call once, and the cluster report shows it as used."""
    job = make_job(tenant, name="recovered")

    def call(seq: int, call_id: int, hour: int) -> dict:
        start = ts(T0) + hour * HOUR
        return {"seq": seq, "kind": "usage", "ts": start + HOUR, "data": {
            "job": job.engine_id, "role": "policy", "fn": "forward_backward", "wpg": "w0", "devices": 1.0,
            "start": start, "end": start + HOUR, "setup_s": 0.0, "exec_s": HOUR, "call": call_id, "tenant": "",
            "queued_s": 0.0}}  # fmt: skip

    before = [{"seq": 1, "kind": "state", "ts": 1.0, "data": {"state": "running"}}, call(2, 1, 0),
              {"seq": 3, "kind": "checkpoint", "ts": 2.0,
               "data": {"step": 1, "tag": "step-1", "path": "/x", "state": {}}},
              call(4, 2, 1)]  # fmt: skip
    after = [{"seq": 5, "kind": "recovery", "ts": 3.0, "data": {"message": "driver died", "attempt": 1,
                                                                "redone_after_seq": 3}},
             call(6, 3, 2)]  # fmt: skip
    ingest.ingest_events(job=job, events=before)  # the redone row came in an earlier pull
    ingest.ingest_events(job=job, events=after)
    ingest.ingest_events(job=job, events=before + after)  # a replayed pull changes nothing
    assert dict(job.usage.values_list("seq", "redone")) == {2: False, 4: True, 6: False}

    client = token_client(tenant.viewer, tenant.organization)
    summary = client.get(SUMMARY, {"month": "2025-03"}).json()
    assert (summary["device_hours"], summary["redone_device_hours"], summary["calls"]) == (
        pytest.approx(2.0), pytest.approx(1.0), 2)
    assert selectors.device_hours_in_month(organization=tenant.organization, when=T0) == pytest.approx(2.0)  # quota
    savings = client.get("/api/v1/billing/savings/").json()["jobs"][0]
    assert (savings["billed_device_hours"], savings["redone_device_hours"]) == (pytest.approx(2.0), pytest.approx(1.0))
    assert [row["redone"] for row in client.get("/api/v1/billing/usage/").json()["results"]] == [False, True, False]

    for hour in range(4):
        sample(T0 + dt.timedelta(hours=hour), 4)
    cluster = session_client(staff).get(CLUSTER, {"month": "2025-03"}).json()
    capacity = cluster["capacity_device_hours"]
    assert (cluster["billed_device_hours"], cluster["redone_device_hours"]) == (pytest.approx(2.0), pytest.approx(1.0))
    assert cluster["idle_device_hours"] == pytest.approx(capacity - 3.0)
    rows = read_csv(session_client(staff).get(CLUSTER, {"month": "2025-03", "format": "csv"}))
    assert [(r[0], r[2]) for r in rows[1:]] == [("organization", "Acme"), ("redone", "redone"), ("idle", "idle")]
    assert sum(float(r[3]) for r in rows[1:]) == pytest.approx(capacity)  # every device-hour accounted once


@pytest.mark.django_db(transaction=True)
def test_the_migration_sums_the_ledgers_already_there(tenant):
    """Upgrading keeps every job's savings: ``billing/0005`` sums the usage rows already stored into
    the jobs' ledger totals, as the ingest would have."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from billing.selectors import job_savings
    from engine.accounting.metering import savings_of_rows

    job = make_job(tenant, name="old")
    rows = [{"seq": s, "call": s // 2, "role": "policy", "fn": "generate" if s % 3 else "sync_weights",
             "wpg": "w", "devices": 1.0, "start": 10.0 * s, "end": 10.0 * s + 4, "setup_s": 0.5, "queued_s": 1.0,
             "device_seconds": 4.0, "redone": s in (5, 6)} for s in range(1, 10)]
    executor = MigrationExecutor(connection)
    executor.migrate([("billing", "0004_usageentry_redone")])
    old_state = executor.loader.project_state([("billing", "0004_usageentry_redone")]).apps
    OldUsage = old_state.get_model("billing", "UsageEntry")
    OldUsage.objects.bulk_create([OldUsage(organization_id=tenant.organization.pk, job_id=job.pk, **r) for r in rows])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    job.refresh_from_db()
    expected = savings_of_rows([r for r in rows if not r["redone"]], job.reserved_devices, job.deployment_mode)
    got = job_savings(job=job)
    assert {k: got[k] for k in expected} == expected
    assert got["redone_device_hours"] == pytest.approx(8.0 / 3600)
