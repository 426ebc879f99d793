"""Periodic billing tasks: quota enforcement (run by the beat every 30 s; idempotent) and the
cluster capacity sample (every ``BILLING_CAPACITY_PERIOD_S``)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from accounts.models import Quota
from billing.models import CapacitySample
from billing.selectors import device_hours_in_month


@shared_task
def enforce_quotas() -> dict[str, int]:
    """Pause the running jobs of organizations that used up this month's device-hour budget, and
    resume the jobs this task paused once the budget allows again (quota raised, a new month)."""
    from jobs import services
    from jobs.models import Job, JobState

    paused = resumed = 0
    now = timezone.now()
    for quota in Quota.objects.select_related("organization"):
        org = quota.organization
        budget = quota.device_hours_per_month
        over = budget is not None and device_hours_in_month(organization=org, when=now) >= float(budget)
        if over:
            for job in Job.objects.filter(organization=org, state__in=(JobState.QUEUED, JobState.PROFILING,
                                                                       JobState.RUNNING)):
                services.job_pause(job=job, actor=None, by_quota=True)
                paused += 1
        else:
            for job in Job.objects.filter(organization=org, state=JobState.PAUSED, paused_by_quota=True):
                services.job_resume(job=job, actor=None)
                resumed += 1
    # organizations without a quota row have no budget: nothing of theirs was paused by one
    return {"paused": paused, "resumed": resumed}


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
