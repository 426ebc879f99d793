"""Sending what ``notifications.services`` decided to send.

A delivery's first attempt is a task queued when it is made; a failed one (no 2xx within
``TIMEOUT_S``, or no answer) waits ``backoff(attempts)`` and is sent again by the beat's
``deliver_due``, until ``MAX_ATTEMPTS`` have failed (then it is ``failed``). A worker claims a
delivery before it sends it (a conditional update), so two workers never send it at once, and a
delivered one is never sent again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db.models import Q
from django.utils import timezone

from notifications.models import Delivery
from notifications.signing import HEADER, signature

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
TIMEOUT_S = 10.0
CLAIM_S = 60  # how long a claimed delivery is another worker's (longer than an attempt takes)


def backoff(attempts: int) -> dt.timedelta:
    """The wait after the ``attempts``-th failed attempt: 30 s, 2 min, 8 min, 32 min."""
    return dt.timedelta(seconds=30 * 4 ** (attempts - 1))


def _claim(delivery_id: int, now: dt.datetime) -> Delivery | None:
    due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    claimed = Delivery.objects.filter(due, pk=delivery_id, state=Delivery.State.PENDING).update(
        next_attempt_at=now + dt.timedelta(seconds=CLAIM_S))
    return Delivery.objects.select_related("webhook").get(pk=delivery_id) if claimed else None


def _post(delivery: Delivery) -> tuple[int | None, str]:
    """One attempt: (the answer's status or None, why it failed or "")."""
    body = json.dumps(delivery.payload, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "plexrl-webhooks",
               HEADER: signature(delivery.webhook.secret, int(time.time()), body),
               "PlexRL-Event": delivery.event, "PlexRL-Delivery": str(delivery.pk)}
    # http(s) URLs only: webhook_create refuses any other scheme
    request = urllib.request.Request(delivery.webhook.url, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310
            return answer.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"answered {exc.code}"
    except (OSError, ValueError) as exc:
        return None, str(getattr(exc, "reason", exc))[:500]


@shared_task
def deliver(delivery_id: int) -> str:
    """One attempt of a delivery that is due; its outcome is recorded on it. Returns its state."""
    now = timezone.now()
    delivery = _claim(delivery_id, now)
    if delivery is None:
        return "not due"
    status, error = _post(delivery)
    delivery.attempts += 1
    delivery.response_status = status
    if status is not None and 200 <= status < 300:
        delivery.state, delivery.error, delivery.delivered_at, delivery.next_attempt_at = (
            Delivery.State.DELIVERED, "", timezone.now(), None)
    elif delivery.attempts >= MAX_ATTEMPTS:
        delivery.state, delivery.error, delivery.next_attempt_at = Delivery.State.FAILED, error, None
    else:
        delivery.error, delivery.next_attempt_at = error, timezone.now() + backoff(delivery.attempts)
    delivery.save(update_fields=["attempts", "response_status", "state", "error", "delivered_at", "next_attempt_at"])
    return delivery.state


@shared_task
def deliver_due() -> int:
    """Send again the deliveries whose back-off is over (the beat, every 15 s); how many were."""
    due = Delivery.objects.filter(state=Delivery.State.PENDING, next_attempt_at__lte=timezone.now())
    sent = 0
    for delivery_id in due.values_list("pk", flat=True)[:200]:
        deliver(delivery_id)
        sent += 1
    return sent


@shared_task
def email_owner(job_id: int, event: str) -> bool:
    """E-mail the job's owner of ``event``; whether a mail went."""
    from jobs.models import Job
    from notifications.models import JobEvent

    job = Job.objects.select_related("created_by", "organization").filter(pk=job_id).first()
    if job is None or job.created_by is None or not job.created_by.email:
        return False
    label = JobEvent(event).label
    subject = f"[PlexRL] {label}: {job.name or f'job {job.pk}'}"
    lines = [f"{label}: {job.name or f'job {job.pk}'} in {job.organization.name}.", f"State: {job.state}."]
    if job.state_reason:
        lines.append(f"Reason: {job.state_reason}.")
    lines.append("You are e-mailed when your jobs end; change which events on the Notifications page.")
    send_mail(subject, "\n".join(lines), settings.DEFAULT_FROM_EMAIL, [job.created_by.email])
    return True
