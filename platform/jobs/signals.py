"""Signals of the jobs app.

``job_ended(organization_id=...)``: sent after commit when one of the organization's jobs reached
an end (succeeded, failed or cancelled): its slot frees, and ``jobs.tasks.on_job_ended`` starts the
next job waiting for one (``jobs.slots``).

``job_notable(job_id=..., event=...)``: sent after commit when a job succeeded, failed, was
cancelled (``event``: ``job.succeeded``, ``job.failed``, ``job.cancelled``) or was held by its
organization's quota (``job.held``); the notifications app tells its owner and its webhooks.
"""

from django.dispatch import Signal

job_ended = Signal()
job_notable = Signal()


def send_job_ended_on_commit(organization_id: int) -> None:
    from django.db import transaction

    transaction.on_commit(lambda: job_ended.send(sender=None, organization_id=organization_id))


def send_job_notable_on_commit(job_id: int, event: str) -> None:
    from django.db import transaction

    transaction.on_commit(lambda: job_notable.send(sender=None, job_id=job_id, event=event))
