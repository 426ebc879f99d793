"""Celery tasks bridging the platform to the engine (launch, cancel, pause, resume, event pull).

Every task is idempotent: tasks are acknowledged late, so a lost worker means redelivery. Launch
is safe to repeat because the engine's submit is idempotent by job id; the pull is safe because
ingestion upserts by (job, seq) behind the job's cursor.

Redelivery of a task whose worker was killed waits for the broker's visibility timeout (an hour on
Redis), too long for a launch: the periodic pull launches again any job still unknown to the engine
``RELAUNCH_AFTER`` after it was created (``pull_events``).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from billing.selectors import budget_left_s
from engine.errors import EngineError, UnknownJob
from jobs import ingest, slots
from jobs.engine import engine, tenant_of
from jobs.models import TERMINAL_STATES, Job, JobState

PULL_BATCH = 1000
# A job the engine still does not know this long after its creation lost its launch (its worker
# died mid-task): the pull launches it again. Well above a launch's own time (seconds).
RELAUNCH_AFTER = timedelta(seconds=30)

logger = logging.getLogger(__name__)


@shared_task
def launch_job(job_id: int) -> None:
    job = Job.objects.select_related("organization__plan").get(pk=job_id)
    if job.state == JobState.CANCELLED or job.waiting_for_slot:  # a queued job goes when a slot frees
        return
    plan = job.organization.plan
    try:
        # its organization's weight and budget first: the scheduler orders its calls by them
        engine().set_tenant(tenant_of(job.organization_id), weight=plan.weight,
                            device_seconds=budget_left_s(job.organization))
        engine().submit_job(job.engine_id, job.spec, tenant=tenant_of(job.organization_id), priority=job.priority)
    except (EngineError, ValueError) as exc:  # the spec no longer validates (a model was removed, ...)
        Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, state_reason=f"launch refused: {exc}")
        return
    if job.state == JobState.PAUSED:  # paused before it reached the engine
        engine().pause(job.engine_id)


@shared_task
def cancel_job(job_id: int, reason: str = "") -> None:
    job = Job.objects.get(pk=job_id)
    with contextlib.suppress(UnknownJob):  # never launched: nothing runs
        engine().cancel(job.engine_id, reason)


@shared_task
def pause_job(job_id: int) -> None:
    job = Job.objects.get(pk=job_id)
    with contextlib.suppress(UnknownJob):  # launch_job pauses it when it gets there
        engine().pause(job.engine_id)


@shared_task
def resume_job(job_id: int) -> None:
    job = Job.objects.get(pk=job_id)
    with contextlib.suppress(UnknownJob):  # never launched: launch_job starts it running
        engine().resume(job.engine_id)


@shared_task
def pull_events(job_id: int) -> int:
    """Ingest the job's new events, batch by batch; returns how many were new."""
    total = 0
    while True:
        job = Job.objects.get(pk=job_id)
        try:
            batch = engine().events(job.engine_id, job.event_cursor, PULL_BATCH)
        except UnknownJob:  # not launched yet, or its launch was lost
            if (job.state in (JobState.QUEUED, JobState.PAUSED) and not job.waiting_for_slot
                    and timezone.now() - job.created_at > RELAUNCH_AFTER):
                logger.warning("job %s is unknown to the engine %s after its creation: launching it again",
                               job.pk, RELAUNCH_AFTER)
                launch_job(job_id)
            return total
        if not batch:
            if job.state in TERMINAL_STATES:
                status = engine().status(job.engine_id)
                if not status["active"] and status["last_seq"] == job.event_cursor:
                    Job.objects.filter(pk=job.pk).update(events_complete=True)
            return total
        total += ingest.ingest_events(job=job, events=batch)


@shared_task
def pull_all_events() -> int:
    """Every job whose log may still have events to read (the beat runs this every few seconds);
    then the organizations with jobs waiting for a slot get theirs released, should one have
    freed without its release (a worker lost between a job's end and the release)."""
    pulled = sum(pull_events(job_id) for job_id in
                 Job.objects.filter(events_complete=False, waiting_for_slot=False).values_list("pk", flat=True))
    waiting = Job.objects.filter(state=JobState.QUEUED, waiting_for_slot=True)
    for organization_id in waiting.order_by().values_list("organization_id", flat=True).distinct():
        slots.release(organization_id, launch_job.delay)
    return pulled


def on_job_ended(*, organization_id: int, **_: object) -> None:
    """``jobs.signals.job_ended`` (after commit): the next job waiting for a slot may start."""
    slots.release(organization_id, launch_job.delay)


def on_plan_changed(*, organization_ids: list[int], **_: object) -> None:
    """``accounts.signals.plan_changed`` (after commit): the queued jobs a raised concurrency limit
    lets through start (the billing app pushes the new weight and budget)."""
    for organization_id in organization_ids:
        slots.release(organization_id, launch_job.delay)
