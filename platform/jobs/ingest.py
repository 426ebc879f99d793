"""The ingestion of a job's event log (``ingest_events``, called by the pull task) and the state
helpers every write on a job shares. Each ingest runs in one transaction; its live pushes to the
dashboard's websockets (``jobs.broadcast``) go after commit."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from billing.models import UsageEntry
from billing.services import usage_totals_refresh
from engine.control import PROFILE_STEPS
from jobs import broadcast, signals
from jobs.models import TERMINAL_STATES, Job, JobEvent, JobMetric, JobState


def job_locked(job: Job) -> Job:
    """The job row again, locked for this transaction (its writes never interleave)."""
    return Job.objects.select_for_update().get(pk=job.pk)


def job_set_state(job: Job, state: str, reason: str, when: dt.datetime | None = None) -> None:
    """Set the state and its reason; stamp the start and the end the first time they happen."""
    when = when or timezone.now()
    job.state, job.state_reason = state, reason
    if state in (JobState.PROFILING, JobState.RUNNING) and job.started_at is None:
        job.started_at = when
    if state in TERMINAL_STATES and job.finished_at is None:
        job.finished_at = when


def ingest_events(*, job: Job, events: list[dict[str, Any]]) -> int:
    """Upsert a batch of the job's events (in seq order) and move its cursor; returns how many were
    new. Replaying events already ingested changes nothing (unique by (job, seq), and the cursor).

    A ``recovery`` event marks the job's usage between the checkpoint it resumed from and itself as
    ``redone`` (billing skips it).

    State follows the log, except where the platform already decided: a job the platform cancelled
    stays cancelled; a paused job stays paused until the platform resumes it.

    After commit, the rows stored push to the job's websocket group (metrics and other events, then
    a job snapshot if its state changed) and the usage entries to the cluster's."""
    with transaction.atomic():
        job = job_locked(job)
        fresh = [e for e in events if e["seq"] > job.event_cursor]
        if not fresh:
            return 0
        before = _state_of(job)
        metrics, usage, other = [], [], []
        redone: list[tuple[int, int]] = []  # (after seq, before seq) of each recovery's redone usage
        for e in fresh:
            kind, data = e["kind"], e["data"]
            if kind == "metrics":
                metrics.append(JobMetric(job=job, step=data["step"], seq=e["seq"], data=data))
            elif kind == "usage":
                seconds = data["end"] - data["start"]
                usage.append(UsageEntry(
                    organization_id=job.organization_id, job=job, seq=e["seq"], call=data.get("call", 0),
                    role=data["role"], fn=data["fn"], wpg=data["wpg"], devices=data["devices"],
                    start=data["start"], end=data["end"], setup_s=data.get("setup_s") or 0.0,
                    exec_s=data.get("exec_s"), queued_s=data.get("queued_s") or 0.0,
                    device_seconds=data["devices"] * seconds))
            else:
                other.append(JobEvent(job=job, seq=e["seq"], kind=kind, data=data, ts=e["ts"]))
                if kind == "state":
                    _follow(job, data, e["ts"])
                elif kind == "recovery" and "redone_after_seq" in data:
                    redone.append((data["redone_after_seq"], e["seq"]))
        JobMetric.objects.bulk_create(metrics, ignore_conflicts=True)
        UsageEntry.objects.bulk_create(usage, ignore_conflicts=True)
        JobEvent.objects.bulk_create(other, ignore_conflicts=True)
        for after, before_seq in redone:  # rows of this batch or of earlier ones
            UsageEntry.objects.filter(job=job, seq__gt=after, seq__lt=before_seq).update(redone=True)
        if usage or redone:  # the job's ledger totals change with its ledger, in this transaction
            usage_totals_refresh(job_id=job.pk)
        if job.state == JobState.PROFILING and metrics and max(m.step for m in metrics) >= PROFILE_STEPS:
            job.state = JobState.RUNNING
        job.event_cursor = max(e["seq"] for e in fresh)
        job.save()
        if job.state in TERMINAL_STATES and before[0] not in TERMINAL_STATES:
            signals.send_job_ended_on_commit(job.organization_id)  # its slot frees: a queued job may start
            signals.send_job_notable_on_commit(job.pk, f"job.{job.state}")
        _push_ingested(job, metrics=metrics, usage=usage, other=other, state_changed=_state_of(job) != before)
        return len(fresh)


def _state_of(job: Job) -> tuple:
    """What a job snapshot shows besides the cursor: a change pushes a fresh snapshot."""
    return job.state, job.state_reason, job.started_at, job.finished_at


def _push_ingested(job: Job, *, metrics: list[JobMetric], usage: list[UsageEntry], other: list[JobEvent],
                   state_changed: bool) -> None:
    """Queue the live pushes of one ingest (sent after commit). The rows are read back by
    (job, seq): ``bulk_create(ignore_conflicts=True)`` neither says which rows it stored (a metrics
    step already stored under another seq is skipped) nor returns ids on PostgreSQL."""
    points = []
    if metrics:
        points += map(broadcast.metrics_message, JobMetric.objects.filter(job=job, seq__in=[m.seq for m in metrics]))
    if other:
        points += map(broadcast.event_message, JobEvent.objects.filter(job=job, seq__in=[e.seq for e in other]))
    points.sort(key=lambda message: message["seq"])
    if state_changed:
        points.append(broadcast.job_message(job))
    broadcast.send_on_commit(broadcast.job_group(job.pk), points)
    if usage:
        entries = (UsageEntry.objects.filter(job=job, seq__in=[u.seq for u in usage])
                   .select_related("job", "organization").order_by("id"))
        broadcast.send_on_commit(broadcast.CLUSTER_GROUP, map(broadcast.usage_message, entries))


def _follow(job: Job, data: dict[str, Any], ts: float) -> None:
    """Apply an engine ``state`` event to the job, unless the platform's own decision stands."""
    state = data.get("state")
    when = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    if job.state == JobState.CANCELLED or state in ("queued", "paused"):
        return  # the platform cancelled or paused it; the engine reports what it did
    if state == "running":
        if job.state == JobState.PAUSED:
            return  # resumed only by the platform
        profiled = JobMetric.objects.filter(job=job).aggregate(m=Max("step"))["m"] or 0
        job_set_state(job, JobState.RUNNING if profiled >= PROFILE_STEPS else JobState.PROFILING, "", when)
    elif state in ("succeeded", "failed", "cancelled"):
        job_set_state(job, state, data.get("reason", ""), when)
