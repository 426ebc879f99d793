"""Jobs and billing services without a worker: validation through the engine's JobSpec, quotas,
ingestion of an event log (idempotent, state following), savings, and quota enforcement."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from accounts.models import AuditLog, Plan
from accounts.services import organization_create
from billing.models import UsageEntry
from billing.selectors import job_savings
from billing.tasks import enforce_quotas
from jobs import ingest, services, slots
from jobs.models import Job, JobEvent, JobMetric, JobState
from tests.platform.builders import metrics, state, usage
from tests.platform.factories import UserFactory
from tests.platform.tenants import give_plan

pytestmark = pytest.mark.django_db
SPEC = {"task": "arith", "model": "tiny-arith", "steps": 3, "seed": 1, "rollout": "torch", "trainer": "torch"}


@pytest.fixture
def org():
    owner = UserFactory()
    return organization_create(name="Lab", owner=owner), owner


def test_the_engine_spec_validates_and_its_errors_name_the_field(org):
    organization, owner = org
    with pytest.raises(ValidationError) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC | {"steps": 0})
    assert "spec.steps" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC | {"task": "poetry"})
    assert "spec.task" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC, rollout_devices=0)
    assert "rollout_devices" in err.value.message_dict
    assert not Job.objects.exists()
    job = services.job_create(organization=organization, user=owner, spec=SPEC, name="ok")
    assert job.state == JobState.QUEUED
    assert job.spec["grpo"]["prompts_per_step"] > 0  # normalised by the engine's JobSpec
    assert AuditLog.objects.filter(organization=organization, action="job.created", target=job.engine_id).exists()


def test_plan_limits_refuse_a_job_and_create_nothing(org):
    organization, owner = org
    give_plan(organization, max_devices_per_job=2, max_concurrent_jobs=1, max_priority="normal")
    with pytest.raises(services.QuotaExceeded) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC, rollout_devices=2, train_devices=1)
    assert err.value.limit == "max_devices_per_job"
    with pytest.raises(services.QuotaExceeded) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC, priority="high")
    assert err.value.limit == "max_priority"
    with pytest.raises(ValidationError) as err:
        services.job_create(organization=organization, user=owner, spec=SPEC, priority="urgent")
    assert "priority" in err.value.message_dict
    assert Job.objects.count() == 0


def test_the_concurrent_job_limit_holds_jobs_in_submission_order_and_releases_them(
        org, django_capture_on_commit_callbacks):
    organization, owner = org
    give_plan(organization, max_concurrent_jobs=2)
    with django_capture_on_commit_callbacks(execute=False) as launches:
        jobs = [services.job_create(organization=organization, user=owner, spec=SPEC, name=f"j{i}") for i in range(5)]
    assert len(launches) == 2  # only the first two are sent to the engine
    assert [j.waiting_for_slot for j in jobs] == [False, False, True, True, True]
    assert all("waiting for a slot" in j.state_reason and j.state == JobState.QUEUED for j in jobs[2:])
    services.job_pause(job=jobs[2], actor=owner)  # a paused waiting job keeps its place, skipped while paused
    with django_capture_on_commit_callbacks(execute=True):
        ingest.ingest_events(job=jobs[0], events=[state(1, "running"), state(2, "succeeded")])
    waiting = {j.name: j.waiting_for_slot for j in Job.objects.all()}
    assert waiting == {"j0": False, "j1": False, "j2": True, "j3": False, "j4": True}
    with django_capture_on_commit_callbacks(execute=True):
        services.job_cancel(job=jobs[1], actor=owner)
    with django_capture_on_commit_callbacks(execute=True):
        services.job_resume(job=jobs[2], actor=owner)  # resumed: back in the queue, behind nobody
    assert {j.name: j.waiting_for_slot for j in Job.objects.all()} == {
        "j0": False, "j1": False, "j2": True, "j3": False, "j4": False}
    assert Job.objects.get(name="j2").state_reason.startswith("waiting for a slot")
    with django_capture_on_commit_callbacks(execute=True):
        Plan.objects.filter(pk=organization.plan_id).update(max_concurrent_jobs=3)
        slots.release(organization.pk, lambda job_id: None)
    assert not Job.objects.filter(waiting_for_slot=True).exists()


def test_ingestion_is_idempotent_and_follows_the_engine_state(org):
    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC)
    log = [state(1, "queued"), state(2, "running"), metrics(3, 1), usage(4, 1, 10.0, 12.0), metrics(5, 2),
           usage(6, 2, 12.5, 14.0), metrics(7, 3)]
    assert ingest.ingest_events(job=job, events=log[:3]) == 3
    job.refresh_from_db()
    assert job.state == JobState.PROFILING  # the scheduler profiles a new job's first steps
    assert job.started_at is not None
    assert ingest.ingest_events(job=job, events=log) == 4
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert ingest.ingest_events(job=job, events=log) == 0  # a replay: nothing new
    Job.objects.filter(pk=job.pk).update(event_cursor=0)  # a replay from the start: upserts
    job.refresh_from_db()
    ingest.ingest_events(job=job, events=[*log, state(8, "succeeded")])
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert job.finished_at is not None
    assert JobMetric.objects.filter(job=job).count() == 3
    assert UsageEntry.objects.filter(job=job).count() == 2
    assert JobEvent.objects.filter(job=job, kind="state").count() == 3


def test_a_cancelled_or_paused_job_keeps_the_platforms_decision(org):
    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC)
    ingest.ingest_events(job=job, events=[state(1, "queued"), state(2, "running")])
    services.job_pause(job=job, actor=owner)
    ingest.ingest_events(job=job, events=[metrics(3, 1), state(4, "paused"), state(5, "running")])
    job.refresh_from_db()
    assert job.state == JobState.PAUSED  # only the platform resumes
    with pytest.raises(services.InvalidTransition):
        services.job_pause(job=job, actor=owner)
    services.job_cancel(job=job, actor=owner, reason="enough")
    ingest.ingest_events(job=job, events=[state(6, "cancelled", reason="enough")])
    job.refresh_from_db()
    assert (job.state, job.state_reason) == (JobState.CANCELLED, "enough")
    with pytest.raises(services.InvalidTransition):
        services.job_resume(job=job, actor=owner)


def test_savings_against_the_dedicated_counterfactual(org):
    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC, rollout_devices=2, train_devices=2,
                              deployment_mode="isolated_split")
    # calls on two 1-device groups over [0, 10]: 2 s rollout, 3 s train (queued 1 s first, 0.5 s switch),
    # a 1 s sync held by both groups (one call, two rows)
    ingest.ingest_events(job=job, events=[
        usage(1, 1, 0.0, 2.0), usage(2, 2, 4.0, 7.0, queued=1.0, setup=0.5, wpg="t", fn="forward_backward"),
        usage(3, 3, 9.0, 10.0, wpg="w", fn="sync_weights"), usage(4, 3, 9.0, 10.0, wpg="t", fn="sync_weights")])
    s = job_savings(job=job)
    billed = 2.0 + 3.0 + 1.0 + 1.0  # device-seconds
    isolated = 10.0 - (1.0 + 0.5)  # the span less what sharing added
    assert s["billed_device_hours"] == pytest.approx(billed / 3600)
    assert s["isolated_wall_seconds"] == pytest.approx(isolated)
    assert s["counterfactual_device_hours"] == pytest.approx(4 * isolated / 3600)
    assert s["savings"] == pytest.approx(1 - billed / (4 * isolated))
    # against an async split, generation (2 s) overlaps the train side's 2.5 s: the wall is 2 s shorter
    Job.objects.filter(pk=job.pk).update(deployment_mode="async_split")
    job.refresh_from_db()
    s = job_savings(job=job)
    assert s["counterfactual_wall_seconds"] == pytest.approx(isolated - 2.0)
    assert s["counterfactual_device_hours"] == pytest.approx(4 * (isolated - 2.0) / 3600)


@pytest.fixture
def mid_month(monkeypatch) -> float:
    """The platform's clock fixed in the middle of a month; returns it in Unix seconds. This month's
    device-hours count calls by when they started, so a call that started two hours before the real
    now belongs to last month during a month's first two hours."""
    now = dt.datetime(2026, 6, 15, 12, 0, tzinfo=dt.UTC)
    monkeypatch.setattr(timezone, "now", lambda: now)
    return now.timestamp()


def test_quota_enforcement_pauses_over_budget_and_resumes_when_raised(org, mid_month):
    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC)
    ingest.ingest_events(job=job, events=[state(1, "running")])
    now = mid_month
    ingest.ingest_events(job=job, events=[usage(2, 1, now - 7200, now, devices=1.0)])  # 2 device-hours
    plan = give_plan(organization, device_hours_per_month=1)
    # the engine is told what is left (here an overrun of one device-hour: it starts nothing more)
    assert enforce_quotas() == {"paused": 1, "resumed": 0, "budgets": {organization.pk: pytest.approx(-3600.0)}}
    job.refresh_from_db()
    assert (job.state, job.paused_by_quota) == (JobState.PAUSED, True)
    assert enforce_quotas() == {"paused": 0, "resumed": 0, "budgets": {organization.pk: pytest.approx(-3600.0)}}
    with pytest.raises(services.QuotaExceeded):
        services.job_create(organization=organization, user=owner, spec=SPEC)
    Plan.objects.filter(pk=plan.pk).update(device_hours_per_month=10)
    assert enforce_quotas() == {"paused": 0, "resumed": 1, "budgets": {organization.pk: pytest.approx(8 * 3600.0)}}
    job.refresh_from_db()
    assert (job.state, job.paused_by_quota) == (JobState.RUNNING, False)


def test_quota_usage_counts_active_jobs_and_this_months_device_hours(org, mid_month):
    from accounts.selectors import quota_usage

    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC)
    now = mid_month
    ingest.ingest_events(job=job, events=[usage(1, 1, now - 1800, now, devices=2.0)])  # 1 device-hour
    ingest.ingest_events(job=job, events=[usage(2, 2, 0.0, 3600.0, devices=1.0)])  # 1970: another month
    assert quota_usage(organization=organization) == {"device_hours_this_month": 1.0, "over_budget_device_hours": 0.0,
                                                      "concurrent_jobs": 1, "queued_jobs": 0}  # starter: 100 h
    services.job_cancel(job=job, actor=owner)
    assert quota_usage(organization=organization)["concurrent_jobs"] == 0


def test_quota_usage_reports_the_overrun_past_the_budget(org, mid_month):
    from accounts.selectors import quota_usage

    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC)
    give_plan(organization, device_hours_per_month=2.5)
    ingest.ingest_events(job=job, events=[usage(1, 1, mid_month - 3600, mid_month, devices=2.0)])  # 2 hours
    assert quota_usage(organization=organization)["over_budget_device_hours"] == 0.0  # within it
    # the call running as the budget ran out ends: one device-hour, half of it past the budget
    ingest.ingest_events(job=job, events=[usage(2, 2, mid_month - 1800, mid_month, devices=2.0)])
    assert quota_usage(organization=organization)["over_budget_device_hours"] == 0.5


@pytest.mark.parametrize("mode", ["isolated_split", "async_split", "colocated"])
def test_the_kept_ledger_totals_give_the_savings_the_rows_give(org, mode):
    """The savings read from a job's ledger totals (kept by the ingest) equal ``savings_of_rows`` of
    its billed rows, after pulls in pieces, a recovery that marks rows redone, and a replayed pull;
    the organization's report shows the same figures."""
    import random

    from billing.models import UsageEntry
    from billing.selectors import savings_of
    from engine.accounting.metering import savings_of_rows

    organization, owner = org
    job = services.job_create(organization=organization, user=owner, spec=SPEC, rollout_devices=2,
                              train_devices=3, deployment_mode=mode)
    rng, events, t = random.Random(7), [], 100.0
    fns = ("generate", "forward", "forward_backward", "optim_step", "sync_weights")
    for seq in range(1, 61):
        if seq == 40:  # resumed from the checkpoint logged at seq 25: what came after it is redone
            events.append({"seq": seq, "kind": "recovery", "ts": t, "data": {"redone_after_seq": 25}})
            continue
        start = t + rng.uniform(0, 2)
        end = start + rng.uniform(0.1, 5)
        fn = rng.choice(fns)
        call = seq // 2 if fn == "sync_weights" else 1000 + seq  # a sync is one call with two rows
        events.append(usage(seq, call, start, end, devices=rng.choice([1.0, 2.0]), queued=rng.uniform(0, 1),
                            setup=rng.uniform(0, 0.1), wpg=rng.choice("rt"), fn=fn))
        t = end
    # the recovery comes alone in a pull; the last pull replays every event
    for lo, hi in ((0, 10), (10, 39), (39, 40), (40, 60), (0, 60)):
        ingest.ingest_events(job=job, events=events[lo:hi])
        job = Job.objects.select_related("usage_totals").get(pk=job.pk)
        rows = list(UsageEntry.objects.filter(job=job).order_by("seq").values())
        expected = savings_of_rows([r for r in rows if not r["redone"]], 5, mode)
        got = job_savings(job=job)
        assert {k: got[k] for k in expected} == expected, hi  # exactly: the same sums in the same order
        redone = sum(r["device_seconds"] for r in rows if r["redone"]) / 3600
        assert got["redone_device_hours"] == pytest.approx(redone)
    assert sum(r["redone"] for r in rows) == 14  # seqs 26-39
    [row] = savings_of(organization=organization)["jobs"]
    assert {k: row[k] for k in got} == got
