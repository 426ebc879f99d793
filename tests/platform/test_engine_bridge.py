"""The platform drives the engine: a job created through the service layer goes through Redis to a
real Celery worker (its own process), which submits it to the engine (real Ray actors, the tiny
model), and the periodic pull brings its metrics, events and usage back into PostgreSQL. Replaying
the whole event log changes nothing."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

REPO = Path(__file__).resolve().parents[2]
SPEC = {"task": "arith", "model": "tiny-arith", "steps": 3, "seed": 5, "rollout": "torch", "trainer": "torch",
        "grpo": {"prompts_per_step": 8, "samples_per_prompt": 4, "updates_per_step": 2, "eval_every": 3,
                 "eval_size": 10, "max_tokens": 6}}


@pytest.fixture(scope="module")
def engine_home(tmp_path_factory) -> Path:
    """A data directory with the tiny-arith preset built (a short supervised phase: plumbing only)."""
    from engine.models.tiny import TINY_ARITH, build_preset

    home = tmp_path_factory.mktemp("bridge-home")
    build_preset(dataclasses.replace(TINY_ARITH, sft_steps=150, eval_size=20, threads=1),
                 home / "models" / TINY_ARITH.name)
    return home


@pytest.fixture
def worker(engine_home, django_db_setup, tmp_path):
    """``celery -A config worker`` in a process of its own, on the test database and Redis."""
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()  # no task left over from an earlier run
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DJANGO_SETTINGS_MODULE")}
    env |= {"DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "REDIS_URL": settings.REDIS_URL, "PLEXRL_HOME": str(engine_home), "PYTHONPATH": str(REPO)}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
            cwd=REPO / "platform", env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    broker.flushdb()


def wait_until(predicate, timeout: float, poll, what: str, proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the Celery worker exited ({proc.returncode}): {proc.log.read_text()[-3000:]}")
        poll()
        time.sleep(1.0)
    pytest.fail(f"{what} within {timeout} s; the worker's log ends: {proc.log.read_text()[-3000:]}")


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
def test_a_job_runs_through_celery_and_the_engine_and_its_pull_is_idempotent(worker):
    from accounts.services import organization_create
    from jobs import services, tasks
    from jobs.models import Job, JobState
    from tests.platform.factories import UserFactory

    owner = UserFactory()
    org = organization_create(name="Bridge Lab", owner=owner)
    job = services.job_create(organization=org, user=owner, spec=SPEC, name="tiny", rollout_devices=1,
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
