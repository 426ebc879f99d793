"""Signals of the jobs app.

``job_ended(organization_id=...)``: sent after commit when one of the organization's jobs reached
an end (succeeded, failed or cancelled): its slot frees, and ``jobs.tasks.on_job_ended`` starts the
next job waiting for one (``jobs.slots``).
"""

from django.dispatch import Signal

job_ended = Signal()


def send_job_ended_on_commit(organization_id: int) -> None:
    from django.db import transaction

    transaction.on_commit(lambda: job_ended.send(sender=None, organization_id=organization_id))
