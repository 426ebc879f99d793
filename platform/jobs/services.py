"""Writes on jobs: create (validated by the engine's JobSpec, checked against the organization's
plan; past its concurrent-job limit held queued, ``jobs.slots``), cancel, pause and resume (the
ingestion of a job's event log is ``jobs.ingest``). Each runs in one transaction; its audit row
goes in the same transaction, its Celery send and its live pushes to the dashboard's websockets
(``jobs.broadcast``) after commit (a rolled-back write launches and pushes nothing)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization, Plan, Priority, User
from accounts.services import audit_record
from billing.selectors import device_hours_in_month, estimate_figures
from engine.errors import SpecError
from engine.spec import JobSpec
from jobs import broadcast, lineage, signals, slots
from jobs.catalog import resolve_model
from jobs.datasets import resolve_dataset
from jobs.ingest import job_locked, job_set_state
from jobs.models import TERMINAL_STATES, DeploymentMode, Job, JobState

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


def _check_quota(*, organization: Organization, plan: Plan, devices: int, priority: str) -> None:
    """Refuse what the plan does not allow at all (the concurrent-job limit only holds a job)."""
    if plan.max_devices_per_job is not None and devices > plan.max_devices_per_job:
        raise QuotaExceeded("max_devices_per_job",
                            f"the job reserves {devices} devices; plan {plan.name} allows {plan.max_devices_per_job}")
    if not plan.allows_priority(priority):
        raise QuotaExceeded("max_priority",
                            f"priority {priority} is above what plan {plan.name} allows ({plan.max_priority})")
    if plan.device_hours_per_month is not None:
        used = device_hours_in_month(organization=organization, when=timezone.now())
        if used >= float(plan.device_hours_per_month):
            raise QuotaExceeded("device_hours_per_month",
                                f"{used:.2f} of {plan.device_hours_per_month} device-hours used this month")


def _validated(*, organization: Organization, spec: dict, rollout_devices: int, train_devices: int,
               deployment_mode: str, continue_from: int | None = None,
               continue_weights: str = "final") -> tuple[JobSpec, Job | None]:
    """A job's input as the engine will see it: its JobSpec, datasets and registered models resolved to
    paths, the weights of the job it continues (and that job); every error a field error
    (``ValidationError``)."""
    lineage.refuse_paths(spec)
    # a dataset id and a registered model's name become paths (the stored spec keeps the paths)
    spec = resolve_model(organization=organization, spec=resolve_dataset(organization=organization, spec=spec))
    spec, parent = lineage.continued_spec(organization=organization, spec=spec, continue_from=continue_from,
                                          weights=continue_weights)
    parsed = parse_spec(spec)
    errors = {}
    for field, value in (("rollout_devices", rollout_devices), ("train_devices", train_devices)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DEVICES_DECLARED:
            errors[field] = f"must be an integer from 1 to {MAX_DEVICES_DECLARED}"
    if deployment_mode not in DeploymentMode.values:
        errors["deployment_mode"] = f"must be one of {', '.join(DeploymentMode.values)}"
    if errors:
        raise ValidationError(errors)
    return parsed, parent


def job_estimate(*, organization: Organization, spec: dict, rollout_devices: int = 1, train_devices: int = 1,
                 deployment_mode: str = DeploymentMode.ASYNC_SPLIT, continue_from: int | None = None,
                 continue_weights: str = "final") -> dict[str, Any]:
    """What a job would cost, before it runs (``billing.selectors.estimate_figures``): validated
    exactly as ``job_create`` validates it; writes nothing and never calls the engine service."""
    parsed, _ = _validated(organization=organization, spec=spec, rollout_devices=rollout_devices,
                           train_devices=train_devices, deployment_mode=deployment_mode,
                           continue_from=continue_from, continue_weights=continue_weights)
    return estimate_figures(spec=parsed, reserved_devices=rollout_devices + train_devices,
                            deployment_mode=deployment_mode)


def job_create(*, organization: Organization, user: User | None, spec: dict, name: str = "",
               rollout_devices: int = 1, train_devices: int = 1,
               deployment_mode: str = DeploymentMode.ASYNC_SPLIT, priority: str = Priority.NORMAL,
               continue_from: int | None = None, continue_weights: str = "final") -> Job:
    """Store a job and send it to the engine after commit, or, past the plan's concurrent-job
    limit, store it queued with the reason (``jobs.slots``). Refuses (``QuotaExceeded``) what the
    plan does not allow: more devices, a higher priority, a spent device-hour budget.
    ``continue_from``: a job of the organization whose weights (``continue_weights``: final, or
    its latest checkpoint) it starts from (``jobs.lineage``)."""
    parsed, parent = _validated(organization=organization, spec=spec, rollout_devices=rollout_devices,
                                train_devices=train_devices, deployment_mode=deployment_mode,
                                continue_from=continue_from, continue_weights=continue_weights)
    if priority not in Priority.values:
        raise ValidationError({"priority": f"must be one of {', '.join(Priority.values)}"})
    estimate = estimate_figures(spec=parsed, reserved_devices=rollout_devices + train_devices,
                                deployment_mode=deployment_mode)
    from jobs import tasks

    with transaction.atomic():
        # one quota check and slot count at a time
        organization = Organization.objects.select_for_update().select_related("plan").get(pk=organization.pk)
        plan = organization.plan
        _check_quota(organization=organization, plan=plan, devices=rollout_devices + train_devices,
                     priority=priority)
        waits = slots.must_wait(organization=organization, plan=plan)
        job = Job.objects.create(organization=organization, created_by=user, name=name[:200],
                                 spec=parsed.to_dict(), rollout_devices=rollout_devices,
                                 train_devices=train_devices, deployment_mode=deployment_mode,
                                 estimate=estimate, priority=priority, waiting_for_slot=waits,
                                 state_reason=slots.waiting_reason(plan) if waits else "", parent=parent,
                                 parent_weights=continue_weights if parent else "")
        audit_record(organization=organization, actor=user, action="job.created", target=job.engine_id,
                     data={"name": job.name, "task": parsed.task, "steps": parsed.steps, "priority": priority,
                           "waiting_for_slot": waits,
                           **({"continues": parent.engine_id, "weights": continue_weights} if parent else {})})
        if not waits:
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
        if not job.waiting_for_slot:  # one never sent has nothing to stop in the engine
            transaction.on_commit(lambda: tasks.cancel_job.delay(job.pk, job.state_reason))
        signals.send_job_ended_on_commit(job.organization_id)  # its slot, or its place in the queue, frees
        signals.send_job_notable_on_commit(job.pk, "job.cancelled")
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
        if by_quota:
            signals.send_job_notable_on_commit(job.pk, "job.held")
        if job.waiting_for_slot:  # never sent: it keeps its place in the queue, skipped while paused
            slots.release_on_commit(job.organization_id, tasks.launch_job.delay)  # one behind it may go first
        else:
            transaction.on_commit(lambda: tasks.pause_job.delay(job.pk))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job


def job_resume(*, job: Job, actor: User | None) -> Job:
    from jobs import tasks

    with transaction.atomic():
        job = job_locked(job)
        if job.state != JobState.PAUSED:
            raise InvalidTransition(f"the job is {job.state}; only a paused job can be resumed")
        waiting = slots.waiting_reason(job.organization.plan) if job.waiting_for_slot else ""
        job_set_state(job, JobState.RUNNING if job.started_at else JobState.QUEUED, waiting)
        job.paused_by_quota = False
        job.save()
        audit_record(organization=job.organization, actor=actor, action="job.resumed", target=job.engine_id)
        if job.waiting_for_slot:  # back in the queue, at its place: it may start now
            slots.release_on_commit(job.organization_id, tasks.launch_job.delay)
        else:
            transaction.on_commit(lambda: tasks.resume_job.delay(job.pk))
        broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return job

