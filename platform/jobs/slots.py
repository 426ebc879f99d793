"""The plan's concurrent-job limit holds jobs, it does not refuse them.

A job submitted while its organization has ``max_concurrent_jobs`` jobs holding a slot (sent to the
engine and not ended; paused ones keep theirs), or while earlier jobs of it wait, is stored
``queued`` with ``waiting_for_slot`` set and its reason, and is not sent to the engine. When a slot
frees (a job ends, the plan changes, a waiting job is resumed) ``release`` sends the waiting jobs
on, oldest first, as many as there are free slots: each goes to ``launch`` after commit (the
callers pass ``jobs.tasks.launch_job.delay``; this module imports no task, so the tasks can import
it). Paused waiting jobs keep their place but are
skipped until resumed. ``release`` runs with the organization's row locked (as ``job_create``
does), so two releases never hand out one slot twice.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from accounts.models import Organization, Plan
from jobs import broadcast
from jobs.models import Job, JobState
from jobs.selectors import active_jobs_count


def waiting_reason(plan: Plan) -> str:
    return (f"waiting for a slot: plan {plan.name} runs at most {plan.max_concurrent_jobs} jobs at once; "
            f"it starts when one of them ends")


def must_wait(*, organization: Organization, plan: Plan) -> bool:
    """Whether a job submitted now waits for a slot (call with the organization locked)."""
    ahead = Job.objects.filter(organization=organization, state=JobState.QUEUED, waiting_for_slot=True).exists()
    if plan.max_concurrent_jobs is None:
        return ahead  # first come, first served: it does not overtake jobs still waiting
    return ahead or active_jobs_count(organization=organization) >= plan.max_concurrent_jobs


def release(organization_id: int, launch: Callable[[int], object]) -> list[int]:
    """Send on the organization's waiting jobs that fit in its free slots, oldest first; returns
    their ids. ``launch(job_id)`` is called for each after commit."""
    with transaction.atomic():
        organization = Organization.objects.select_for_update().select_related("plan").get(pk=organization_id)
        limit = organization.plan.max_concurrent_jobs
        waiting = (Job.objects.filter(organization=organization, state=JobState.QUEUED, waiting_for_slot=True)
                   .select_for_update().order_by("created_at", "id"))
        if limit is not None:
            free = limit - active_jobs_count(organization=organization)
            if free <= 0:
                return []
            waiting = waiting[:free]
        started = []
        for job in waiting:
            job.waiting_for_slot = False
            job.state_reason = ""
            job.save(update_fields=["waiting_for_slot", "state_reason", "updated_at"])
            started.append(job.pk)
            transaction.on_commit(lambda pk=job.pk: launch(pk))
            broadcast.send_on_commit(broadcast.job_group(job.pk), [broadcast.job_message(job)])
    return started


def release_on_commit(organization_id: int, launch: Callable[[int], object]) -> None:
    """``release`` after the current transaction commits (a waiting job was paused or resumed)."""
    transaction.on_commit(lambda: release(organization_id, launch))
