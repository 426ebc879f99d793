"""Writes on jobs: create (validated by the engine's JobSpec, quota-checked), cancel, pause and
resume (the ingestion of a job's event log is ``jobs.ingest``). Each runs in one transaction; its audit row goes in the
same transaction, its Celery send and its live pushes to the dashboard's websockets
(``jobs.broadcast``) after commit (a rolled-back write launches and pushes nothing)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization, Quota, User
from accounts.services import audit_record
from billing.selectors import device_hours_in_month, estimate_figures
from engine.errors import SpecError
from engine.spec import JobSpec
from jobs import broadcast
from jobs.catalog import resolve_model
from jobs.datasets import resolve_dataset
from jobs.ingest import job_locked, job_set_state
from jobs.models import ACTIVE_STATES, TERMINAL_STATES, DeploymentMode, Job, JobState

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


def job_cancel(*, job: Job, actor: User | None, reason: str = "") -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = job_locked(job)
        if job.state in TERMINAL_STATES:
            raise InvalidTransition(f"the job has {job.state}; it cannot be cancelled")
        job_set_state(job, JobState.CANCELLED, reason or f"cancelled by {actor or 'the platform'}")
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.cancelled", target=job.engine_id,
                     data={"reason": job.state_reason})
        transaction.on_commit(lambda: tasks.cancel_job.delay(job.pk, job.state_reason))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job


def job_pause(*, job: Job, actor: User | None, by_quota: bool = False) -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = job_locked(job)
        if job.state in TERMINAL_STATES or job.state == JobState.PAUSED:
            raise InvalidTransition(f"the job is {job.state}; it cannot be paused")
        job_set_state(job, JobState.PAUSED, "device-hour budget used up" if by_quota else "")
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
        job = job_locked(job)
        if job.state != JobState.PAUSED:
            raise InvalidTransition(f"the job is {job.state}; only a paused job can be resumed")
        job_set_state(job, JobState.RUNNING if job.started_at else JobState.QUEUED, "")
        job.paused_by_quota = False
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.resumed", target=job.engine_id)
        transaction.on_commit(lambda: tasks.resume_job.delay(job.pk))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job
