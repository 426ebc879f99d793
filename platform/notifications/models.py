"""What a job's end is told to: the organization's webhooks (with the log of every delivery) and
each user's choice of e-mails."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Organization


class JobEvent(models.TextChoices):
    """The moments a job's owner and its organization's webhooks are told of."""

    SUCCEEDED = "job.succeeded", "Job succeeded"
    FAILED = "job.failed", "Job failed"
    CANCELLED = "job.cancelled", "Job cancelled"
    HELD = "job.held", "Job held by quota"


ALL_EVENTS = [event.value for event in JobEvent]


def all_events() -> list[str]:
    return list(ALL_EVENTS)


class Webhook(models.Model):
    """An organization's endpoint: each event it subscribes to is POSTed to ``url`` as JSON, signed
    with ``secret`` (``notifications.signing``), retried with back-off until it answers 2xx."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=80, editable=False)
    events = models.JSONField(default=all_events)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.organization} -> {self.url}"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class Delivery(models.Model):
    """One event sent (or being sent) to one webhook: its payload, every attempt's outcome."""

    State = DeliveryState

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey("jobs.Job", on_delete=models.SET_NULL, null=True, related_name="+")
    event = models.CharField(max_length=40, choices=JobEvent.choices)
    payload = models.JSONField()
    state = models.CharField(max_length=20, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.event} of job {self.job_id} to {self.webhook_id}: {self.state}"


class EmailChoice(models.Model):
    """The events a user is e-mailed about for their own jobs (all of them until they choose)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="email_choice")
    events = models.JSONField(default=all_events)

    def __str__(self) -> str:
        return f"{self.user}: {', '.join(self.events) or 'no e-mails'}"
