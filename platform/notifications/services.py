"""Telling people of a job's end: the organization's webhooks (a delivery each, sent by
``notifications.tasks``) and the job's owner by e-mail, as they chose.

``jobs.signals.job_notable(job_id=, event=)`` is sent after commit when a job succeeds, fails, is
cancelled or is held by quota (``jobs.ingest``, ``jobs.services``), once for each time it does
(its end is ingested once, under the job's lock); ``on_job_notable`` takes it from there. Only
the job's own organization's webhooks are ever sent its events.
"""

from __future__ import annotations

import urllib.parse

from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse

from accounts.models import Organization, User
from jobs.models import Job
from notifications.models import ALL_EVENTS, Delivery, EmailChoice, Webhook
from notifications.signing import new_secret

STATE_EVENTS = {"succeeded": "job.succeeded", "failed": "job.failed", "cancelled": "job.cancelled"}


def payload(job: Job, event: str) -> dict:
    """What a webhook is sent: the event and the job, as the API names them."""
    return {
        "event": event,
        "organization": job.organization_id,
        "job": {"id": job.pk, "name": job.name, "state": job.state, "reason": job.state_reason,
                "created_by": job.created_by.username if job.created_by else None,
                "url": reverse("pages:job-detail", args=[job.pk])},
    }


def on_job_notable(*, job_id: int, event: str, **_: object) -> None:
    """``jobs.signals.job_notable`` (after commit): a delivery for each of the job's organization's
    active webhooks that subscribe to ``event``, and the owner's e-mail if they chose it."""
    from notifications import tasks

    job = Job.objects.select_related("created_by").filter(pk=job_id).first()
    if job is None:
        return
    hooks = [h for h in Webhook.objects.filter(organization_id=job.organization_id, active=True) if event in h.events]
    body = payload(job, event)
    for hook in hooks:
        delivery = Delivery.objects.create(webhook=hook, job=job, event=event, payload=body)
        transaction.on_commit(lambda pk=delivery.pk: tasks.deliver.delay(pk))
    owner = job.created_by
    if owner is not None and owner.email and event in email_events(owner):
        transaction.on_commit(lambda: tasks.email_owner.delay(job.pk, event))


def email_events(user: User) -> list[str]:
    choice = EmailChoice.objects.filter(user=user).first()
    return list(ALL_EVENTS) if choice is None else list(choice.events)


def _checked_events(events: list[str]) -> list[str]:
    unknown = sorted(set(events) - set(ALL_EVENTS))
    if unknown:
        raise ValidationError({"events": f"Unknown events {', '.join(unknown)}; known: {', '.join(ALL_EVENTS)}."})
    return [e for e in ALL_EVENTS if e in events]  # in their own order, once each


def email_choose(*, user: User, events: list[str]) -> list[str]:
    """The events ``user`` is e-mailed about for their own jobs from now on."""
    chosen = _checked_events(events)
    EmailChoice.objects.update_or_create(user=user, defaults={"events": chosen})
    return chosen


def webhook_create(*, organization: Organization, user: User, url: str, events: list[str]) -> Webhook:
    """A webhook of ``organization`` at ``url`` (http or https) for ``events`` (at least one),
    with a new secret (shown to its creator once)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValidationError({"url": "A webhook's URL starts with http:// or https://."})
    chosen = _checked_events(events)
    if not chosen:
        raise ValidationError({"events": "Choose at least one event."})
    return Webhook.objects.create(organization=organization, created_by=user, url=url, events=chosen,
                                  secret=new_secret())
