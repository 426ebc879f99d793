"""Writes on jobs: create (validated by the engine's JobSpec, quota-checked), cancel, pause, resume,
and the ingestion of a job's event log. Each runs in one transaction; its audit row goes in the
same transaction, its Celery send and its live pushes to the dashboard's websockets
(``jobs.broadcast``) after commit (a rolled-back write launches and pushes nothing)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from accounts.models import Organization, Quota, User
from accounts.services import audit_record
from billing.models import UsageEntry
from billing.selectors import device_hours_in_month, estimate_figures
from billing.services import usage_totals_refresh
from engine.errors import SpecError
from engine.scheduler.core import Policy
from engine.spec import JobSpec
from jobs import broadcast
from jobs.catalog import resolve_model
from jobs.datasets import resolve_dataset
from jobs.models import ACTIVE_STATES, TERMINAL_STATES, DeploymentMode, Job, JobEvent, JobMetric, JobState

PROFILE_STEPS = Policy().profile_steps  # steps a new job runs before the scheduler places it
MAX_DEVICES_DECLARED = 4096


class QuotaExceeded(Exception):
    """The organization's quota does not allow this (the API answers 409, naming the limit)."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit
        self.message = message


class InvalidTransition(Exception):
    """The job's state does not allow the action (the API answers 409)."""


def parse_spec(spec: Any) -> JobSpec:
    """The engine's one validation; its errors become field errors (``spec.<field>``)."""
    if not isinstance(spec, dict):
        raise ValidationError({"spec": "must be an object"})
    try:
        return JobSpec.from_dict(spec)
    except SpecError as exc:
        raise ValidationError({f"spec.{exc.field}": exc.message}) from None
    except TypeError as exc:  # an unknown key: from_dict passes keys to the dataclass
        raise ValidationError({"spec": str(exc).replace("__init__() ", "")}) from None


def _check_quota(*, organization: Organization, devices: int) -> None:
    quota = Quota.objects.filter(organization=organization).first()
    if quota is None:
        return
    if quota.max_devices_per_job is not None and devices > quota.max_devices_per_job:
        raise QuotaExceeded("max_devices_per_job",
                            f"the job reserves {devices} devices; the limit is {quota.max_devices_per_job}")
    if quota.max_concurrent_jobs is not None:
        active = Job.objects.filter(organization=organization, state__in=ACTIVE_STATES).count()
        if active >= quota.max_concurrent_jobs:
            raise QuotaExceeded("max_concurrent_jobs",
                                f"{active} jobs are active; the limit is {quota.max_concurrent_jobs}")
    if quota.device_hours_per_month is not None:
        used = device_hours_in_month(organization=organization, when=timezone.now())
        if used >= float(quota.device_hours_per_month):
            raise QuotaExceeded("device_hours_per_month",
                                f"{used:.2f} of {quota.device_hours_per_month} device-hours used this month")


def _validated(*, organization: Organization, spec: dict, rollout_devices: int, train_devices: int,
               deployment_mode: str) -> JobSpec:
    """A job's input as the engine will see it: its JobSpec, datasets and registered models resolved to
    paths; every error a field error (``ValidationError``)."""
    # a dataset id and a registered model's name become paths (the stored spec keeps the paths)
    spec = resolve_model(spec=resolve_dataset(organization=organization, spec=spec))
    parsed = parse_spec(spec)
    errors = {}
    for field, value in (("rollout_devices", rollout_devices), ("train_devices", train_devices)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DEVICES_DECLARED:
            errors[field] = f"must be an integer from 1 to {MAX_DEVICES_DECLARED}"
    if deployment_mode not in DeploymentMode.values:
        errors["deployment_mode"] = f"must be one of {', '.join(DeploymentMode.values)}"
    if errors:
        raise ValidationError(errors)
    return parsed


def job_estimate(*, organization: Organization, spec: dict, rollout_devices: int = 1, train_devices: int = 1,
                 deployment_mode: str = DeploymentMode.ASYNC_SPLIT) -> dict[str, Any]:
    """What a job would cost, before it runs (``billing.selectors.estimate_figures``): validated
    exactly as ``job_create`` validates it; writes nothing and never calls the engine service."""
    parsed = _validated(organization=organization, spec=spec, rollout_devices=rollout_devices,
                           train_devices=train_devices, deployment_mode=deployment_mode)
    return estimate_figures(spec=parsed, reserved_devices=rollout_devices + train_devices,
                            deployment_mode=deployment_mode)


def job_create(*, organization: Organization, user: User | None, spec: dict, name: str = "",
               rollout_devices: int = 1, train_devices: int = 1,
               deployment_mode: str = DeploymentMode.ASYNC_SPLIT) -> Job:
    parsed = _validated(organization=organization, spec=spec, rollout_devices=rollout_devices,
                           train_devices=train_devices, deployment_mode=deployment_mode)
    estimate = estimate_figures(spec=parsed, reserved_devices=rollout_devices + train_devices,
                                deployment_mode=deployment_mode)
    from jobs import tasks

    with transaction.atomic():
        Organization.objects.select_for_update().get(pk=organization.pk)  # one quota check at a time
        _check_quota(organization=organization, devices=rollout_devices + train_devices)
        job = Job.objects.create(organization=organization, created_by=user, name=name[:200],
                                 spec=parsed.to_dict(), rollout_devices=rollout_devices,
                                 train_devices=train_devices, deployment_mode=deployment_mode,
                                 estimate=estimate)
        audit_record(organization=organization, actor=user, action="job.created", target=job.engine_id,
                     data={"name": job.name, "task": parsed.task, "steps": parsed.steps})
        transaction.on_commit(lambda: tasks.launch_job.delay(job.pk))
    return job


def _locked(job: Job) -> Job:
    return Job.objects.select_for_update().get(pk=job.pk)


def job_cancel(*, job: Job, actor: User | None, reason: str = "") -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = _locked(job)
        if job.state in TERMINAL_STATES:
            raise InvalidTransition(f"the job has {job.state}; it cannot be cancelled")
        _set_state(job, JobState.CANCELLED, reason or f"cancelled by {actor or 'the platform'}")
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.cancelled", target=job.engine_id,
                     data={"reason": job.state_reason})
        transaction.on_commit(lambda: tasks.cancel_job.delay(job.pk, job.state_reason))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job


def job_pause(*, job: Job, actor: User | None, by_quota: bool = False) -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = _locked(job)
        if job.state in TERMINAL_STATES or job.state == JobState.PAUSED:
            raise InvalidTransition(f"the job is {job.state}; it cannot be paused")
        _set_state(job, JobState.PAUSED, "device-hour budget used up" if by_quota else "")
        job.paused_by_quota = by_quota
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.paused", target=job.engine_id,
                     data={"by_quota": by_quota})
        transaction.on_commit(lambda: tasks.pause_job.delay(job.pk))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job


def job_resume(*, job: Job, actor: User | None) -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = _locked(job)
        if job.state != JobState.PAUSED:
            raise InvalidTransition(f"the job is {job.state}; only a paused job can be resumed")
        _set_state(job, JobState.RUNNING if job.started_at else JobState.QUEUED, "")
        job.paused_by_quota = False
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.resumed", target=job.engine_id)
        transaction.on_commit(lambda: tasks.resume_job.delay(job.pk))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job


def _set_state(job: Job, state: str, reason: str, when: dt.datetime | None = None) -> None:
    when = when or timezone.now()
    job.state, job.state_reason = state, reason
    if state in (JobState.PROFILING, JobState.RUNNING) and job.started_at is None:
        job.started_at = when
    if state in TERMINAL_STATES and job.finished_at is None:
        job.finished_at = when


# --- ingestion -------------------------------------------------------------------------------------


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
        job = _locked(job)
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
        _set_state(job, JobState.RUNNING if profiled >= PROFILE_STEPS else JobState.PROFILING, "", when)
    elif state in ("succeeded", "failed", "cancelled"):
        _set_state(job, state, data.get("reason", ""), when)
