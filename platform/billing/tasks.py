"""Periodic billing tasks: quota enforcement (run by the beat every 30 s; idempotent) and the
cluster capacity sample (every ``BILLING_CAPACITY_PERIOD_S``).

Quotas are enforced twice. The engine holds an organization's calls the moment its device-hour
budget is spent (``push_tenant``: the scheduler starts no call past it, so the overrun is at most
one call); ``enforce_quotas`` then marks its jobs paused by quota, and resumes them when the
budget allows. The budget pushed is the month's budget less the usage in the ledger, which trails
the engine by the event pull's period: usage not yet pulled is counted again at the next push.
The same push carries the plan's weight, the organization's fair share in the scheduler; the
engine keeps both across a scheduler restart.
"""

from __future__ import annotations

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization
from billing.models import CapacitySample
from billing.selectors import budget_left_s


@shared_task
def enforce_quotas() -> dict[str, object]:
    """Pause the running jobs of organizations that used up this month's device-hour budget, and
    resume the jobs this task paused once the budget allows again (plan changed, a new month).
    Sends each organization's device-seconds left (None: no budget) and weight to the engine after
    commit; returns the counts and those budgets by organization id."""
    from jobs import services
    from jobs.models import Job, JobState

    paused = resumed = 0
    budgets: dict[int, float | None] = {}
    now = timezone.now()
    for org in Organization.objects.select_related("plan"):
        budgets[org.pk] = left = budget_left_s(org, now)
        transaction.on_commit(lambda org_id=org.pk, left=left, weight=org.plan.weight:
                              push_tenant.delay(org_id, left, weight))
        if left is not None and left <= 0:
            for job in Job.objects.filter(organization=org, state__in=(JobState.QUEUED, JobState.PROFILING,
                                                                       JobState.RUNNING)):
                services.job_pause(job=job, actor=None, by_quota=True)
                paused += 1
        else:
            for job in Job.objects.filter(organization=org, state=JobState.PAUSED, paused_by_quota=True):
                services.job_resume(job=job, actor=None)
                resumed += 1
    return {"paused": paused, "resumed": resumed, "budgets": budgets}


def on_plan_changed(*, organization_ids: list[int], **_: object) -> None:
    """``accounts.signals.plan_changed`` (after commit): the engine gets the organizations' new
    weight and budget now, not at the next ``enforce_quotas``."""
    for organization in Organization.objects.filter(pk__in=organization_ids).select_related("plan"):
        push_tenant.delay(organization.pk, budget_left_s(organization), organization.plan.weight)


@shared_task
def push_tenant(organization_id: int, device_seconds: float | None, weight: float = 1.0) -> None:
    """Tell the engine how many device-seconds the organization's jobs may still use (None: no
    limit; its scheduler holds their calls past that) and its plan's weight (its fair share)."""
    from jobs.engine import engine, tenant_of  # looked up per call: the engine handle is made lazily

    engine().set_tenant(tenant_of(organization_id), weight=weight, device_seconds=device_seconds)


@shared_task
def record_capacity() -> float:
    """Store one ``CapacitySample``: the device slots of the engine's groups now (their sum).

    If the engine does not answer, nothing is stored: the gap counts as no capacity (see
    ``billing.selectors.capacity_device_hours``). A redelivered task adds one more sample of the
    same step function, which changes nothing billed."""
    from jobs import engine as engine_client  # looked up per call: the engine handle is made lazily

    snapshot = engine_client.engine().cluster_snapshot()
    groups = [dict(group) for group in snapshot.get("groups", [])]
    devices = float(sum(group.get("devices") or 0 for group in groups))
    CapacitySample.objects.create(at=timezone.now(), devices=devices, groups=groups)
    return devices
