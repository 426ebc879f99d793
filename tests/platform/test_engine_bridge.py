"""The platform drives the engine: a job created through the service layer goes through Redis to a
real Celery worker (its own process), which submits it to the engine (real Ray actors, the tiny
model), and the periodic pull brings its metrics, events and usage back into PostgreSQL. Replaying
the whole event log changes nothing."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from tests.platform import live
from tests.platform.builders import ENGINE_SPEC


@pytest.fixture
def worker(engine_home, django_db_setup, tmp_path):
    """``celery -A config worker`` in a process of its own, on the test database and Redis."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()  # no task left over from an earlier run
    proc = live.celery_worker(live.platform_env(engine_home), tmp_path)
    yield proc
    proc.stop()
    broker.flushdb()


def wait_until(predicate, timeout: float, poll, what: str, proc) -> None:
    live.wait_until(predicate, timeout, what, [proc], poll=poll, every=1.0)


def snapshot(job) -> dict:
    from billing.models import UsageEntry
    from billing.selectors import job_savings
    from jobs.models import JobEvent, JobMetric

    return {
        "metrics": list(JobMetric.objects.filter(job=job).values_list("step", "seq", "data")),
        "events": list(JobEvent.objects.filter(job=job).values_list("seq", "kind", "data")),
        "usage": list(UsageEntry.objects.filter(job=job).values_list("seq", "call", "fn", "device_seconds")),
        "savings": job_savings(job=job),
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_a_job_runs_through_celery_and_the_engine_and_its_pull_is_idempotent(worker, engine_home):
    import json
    import re

    from accounts.services import organization_create
    from billing.tasks import push_tenant
    from engine.paths import events_path
    from jobs import services, tasks
    from jobs.models import Job, JobState
    from tests.platform.factories import UserFactory

    owner = UserFactory()
    org = organization_create(name="Bridge Lab", owner=owner)
    push_tenant.delay(org.pk, 1e9, 2.0)  # the engine holds the organization's budget (ample here) and weight
    job = services.job_create(organization=org, user=owner, spec=ENGINE_SPEC, name="tiny", rollout_devices=1,
                              train_devices=1)  # committed: its launch goes to Redis after commit

    def refresh():
        job.refresh_from_db()
        return job

    wait_until(lambda: refresh().state == JobState.SUCCEEDED and job.events_complete, 240,
               tasks.pull_all_events.delay, "the job did not succeed and get fully ingested", worker)
    first = snapshot(job)
    assert [m[0] for m in first["metrics"]] == [1, 2, 3]
    assert [e[2]["state"] for e in first["events"] if e[1] == "state"] == ["queued", "running", "succeeded"]
    assert first["usage"], "no usage reached the ledger"
    logged = [json.loads(line)["data"] for line in events_path(engine_home, job.engine_id).read_text().splitlines()
              if json.loads(line)["kind"] == "usage"]
    assert {u["tenant"] for u in logged} == {f"org-{org.pk}"}  # its calls spent its organization's budget
    assert re.search(r"billing\.tasks\.push_tenant\[[^\]]+\] succeeded", worker.log.read_text())
    assert job.started_at is not None
    assert job.finished_at is not None
    savings = first["savings"]
    assert savings["billed_device_hours"] > 0
    assert savings["counterfactual_device_hours"] > 0

    # replay the whole log from the start: the upserts change nothing
    Job.objects.filter(pk=job.pk).update(event_cursor=0, events_complete=False)
    wait_until(lambda: refresh().events_complete, 120, tasks.pull_all_events.delay,
               "the replayed pull did not finish", worker)
    assert snapshot(job) == first
    assert refresh().state == JobState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_a_job_past_the_concurrent_job_limit_waits_queued_and_runs_when_the_earlier_one_ends(worker, engine_home):
    from accounts.services import organization_create
    from engine.paths import events_path
    from jobs import services, tasks
    from jobs.models import Job, JobState
    from tests.platform.factories import UserFactory
    from tests.platform.tenants import give_plan

    owner = UserFactory()
    org = organization_create(name="Queue Lab", owner=owner)
    give_plan(org, max_concurrent_jobs=1, device_hours_per_month=1000)
    first = services.job_create(organization=org, user=owner, spec=ENGINE_SPEC, name="first")
    second = services.job_create(organization=org, user=owner, spec=ENGINE_SPEC | {"seed": 6}, name="second")
    assert (second.state, second.waiting_for_slot) == (JobState.QUEUED, True)
    assert second.state_reason.startswith("waiting for a slot: plan queue-lab-plan runs at most 1 jobs at once")

    def states():
        return {j.name: (j.state, j.waiting_for_slot) for j in Job.objects.all()}

    wait_until(lambda: states()["first"][0] in (JobState.PROFILING, JobState.RUNNING, JobState.SUCCEEDED), 240,
               tasks.pull_all_events.delay, "the first job did not start", worker)
    assert states()["second"] == (JobState.QUEUED, True)  # held while the first one runs, never sent
    assert not events_path(engine_home, second.engine_id).exists()  # the engine has never heard of it
    wait_until(lambda: states() == {"first": (JobState.SUCCEEDED, False), "second": (JobState.SUCCEEDED, False)},
               300, tasks.pull_all_events.delay, "the queued job did not run after the first one ended", worker)
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.started_at >= first.finished_at
