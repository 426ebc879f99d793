"""A job that ends, fails, is cancelled or is held by quota is told to its organization's webhooks
(signed, retried with back-off, every attempt recorded, never another organization's job) and to
its owner by e-mail, as they chose. The webhooks are real HTTP receivers on loopback."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.services import token_create
from jobs import services as job_services
from jobs.ingest import ingest_events
from jobs.models import Job, JobState
from notifications import services, tasks
from notifications.models import Delivery, Webhook
from notifications.services import webhook_create
from plexrl_client.webhooks import verify
from tests.platform.builders import SPEC
from tests.platform.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receivers():
    made: list[Receiver] = []
    yield lambda: made.append(Receiver()) or made[-1]
    for receiver in made:
        receiver.stop()


def client_of(tenant, role: str) -> APIClient:
    client = APIClient()
    token = token_create(user=tenant.user(role), organization=tenant.organization, name=role)[1]
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def make_job(tenant, state=JobState.RUNNING) -> Job:
    return Job.objects.create(organization=tenant.organization, created_by=tenant.member, name="run-1", spec=SPEC,
                              state=state, started_at=timezone.now())


def end(job: Job, state: str, capture) -> None:
    """The engine's log says the job ended (ingested as the pull task would), then commit."""
    with capture(execute=True):
        ingest_events(job=job, events=[{"seq": 1, "ts": 1.0, "kind": "state", "data": {"state": state,
                                                                                        "reason": "because"}}])


def send_pending() -> None:
    for delivery in Delivery.objects.filter(state=Delivery.State.PENDING):
        tasks.deliver(delivery.pk)


def test_a_jobs_end_is_posted_signed_to_its_own_organizations_webhooks_only(
        tenant, other_tenant, receivers, django_capture_on_commit_callbacks):
    ours, theirs = receivers(), receivers()
    hook = webhook_create(organization=tenant.organization, user=tenant.admin, url=ours.url,
                          events=["job.failed", "job.succeeded"])
    webhook_create(organization=other_tenant.organization, user=other_tenant.admin, url=theirs.url,
                   events=["job.failed", "job.succeeded"])
    job = make_job(tenant)
    end(job, "failed", django_capture_on_commit_callbacks)
    send_pending()
    assert theirs.requests == []  # never another organization's job
    ((headers, body),) = ours.requests
    assert verify(hook.secret, headers["PlexRL-Signature"], body)
    assert not verify(hook.secret.replace("_", "-"), headers["PlexRL-Signature"], body)  # another secret
    assert not verify(hook.secret, headers["PlexRL-Signature"], body + b" ")  # another body
    assert headers["PlexRL-Event"] == "job.failed"
    assert json.loads(body) == {"event": "job.failed", "organization": tenant.organization.pk,
                                "job": {"id": job.pk, "name": "run-1", "state": "failed", "reason": "because",
                                        "created_by": tenant.member.username, "url": f"/jobs/{job.pk}/"}}
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.response_status, delivery.job_id) == ("delivered", 1, 200,
                                                                                           job.pk)
    assert headers["PlexRL-Delivery"] == str(delivery.pk)
    send_pending()
    assert len(ours.requests) == 1  # a delivered one is never sent again


def test_a_failed_delivery_is_retried_with_back_off_until_it_answers_and_every_attempt_is_recorded(
        tenant, receivers, django_capture_on_commit_callbacks):
    receiver = receivers()
    receiver.statuses.extend([500, 503])
    webhook_create(organization=tenant.organization, user=tenant.admin, url=receiver.url, events=["job.failed"])
    end(make_job(tenant), "failed", django_capture_on_commit_callbacks)
    (delivery,) = Delivery.objects.all()
    assert tasks.deliver(delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_status, delivery.error) == (1, 500, "answered 500")
    wait = delivery.next_attempt_at - timezone.now()
    assert dt.timedelta(seconds=25) < wait <= tasks.backoff(1)
    assert tasks.deliver_due() == 0  # not due yet
    assert tasks.deliver(delivery.pk) == "not due"  # nor by a second worker
    Delivery.objects.update(next_attempt_at=timezone.now())
    assert tasks.deliver_due() == 1
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_status, delivery.state) == (2, 503, "pending")
    assert delivery.next_attempt_at - timezone.now() > tasks.backoff(1)  # waits longer each time
    Delivery.objects.update(next_attempt_at=timezone.now())
    tasks.deliver_due()
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.state, delivery.error, delivery.next_attempt_at) == (3, "delivered", "", None)
    assert len(receiver.requests) == 3
    assert [tasks.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [30, 120, 480, 1920]


def test_a_delivery_that_never_answers_fails_after_its_last_attempt(tenant, receivers,
                                                                    django_capture_on_commit_callbacks):
    receiver = receivers()
    webhook_create(organization=tenant.organization, user=tenant.admin, url=receiver.url, events=["job.failed"])
    receiver.stop()  # nothing listens there any more
    end(make_job(tenant), "failed", django_capture_on_commit_callbacks)
    (delivery,) = Delivery.objects.all()
    for _ in range(tasks.MAX_ATTEMPTS):
        Delivery.objects.update(next_attempt_at=None)
        tasks.deliver(delivery.pk)
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.response_status) == ("failed", tasks.MAX_ATTEMPTS, None)
    assert "refused" in delivery.error.lower()
    assert tasks.deliver(delivery.pk) == "not due"


def test_cancelled_and_held_jobs_are_told_to_the_webhooks_that_want_them(tenant, receivers,
                                                                        django_capture_on_commit_callbacks):
    receiver = receivers()
    webhook_create(organization=tenant.organization, user=tenant.admin, url=receiver.url,
                   events=["job.cancelled", "job.held"])
    held, cancelled, succeeded = make_job(tenant), make_job(tenant), make_job(tenant)
    with django_capture_on_commit_callbacks(execute=True):
        job_services.job_pause(job=held, actor=None, by_quota=True)
        job_services.job_pause(job=cancelled, actor=tenant.member)  # paused by its owner: nobody is told
        job_services.job_cancel(job=cancelled, actor=tenant.member)
    end(succeeded, "succeeded", django_capture_on_commit_callbacks)  # not subscribed
    send_pending()
    assert sorted((e["event"], e["job"]["id"]) for e in receiver.events()) == [
        ("job.cancelled", cancelled.pk), ("job.held", held.pk)]


def test_the_owner_is_emailed_of_the_events_they_chose(tenant, django_capture_on_commit_callbacks):
    tenant.member.email = "member@acme.test"
    tenant.member.save()
    first, second = make_job(tenant), make_job(tenant)
    end(first, "failed", django_capture_on_commit_callbacks)
    tasks.email_owner(first.pk, "job.failed")  # the task the commit queued, run here
    (sent,) = mail.outbox
    assert sent.to == ["member@acme.test"]
    assert sent.subject == "[PlexRL] Job failed: run-1"
    assert "Reason: because." in sent.body
    client = client_of(tenant, "member")
    assert client.get("/api/v1/notifications/email/").json() == {"events": ["job.succeeded", "job.failed",
                                                                          "job.cancelled", "job.held"]}
    chosen = client.put("/api/v1/notifications/email/", {"events": ["job.held"]}, format="json")
    assert chosen.json() == {"events": ["job.held"]}
    bad = client.put("/api/v1/notifications/email/", {"events": ["job.exploded"]}, format="json")
    assert bad.status_code == 400
    assert "events" in bad.json()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.on_job_notable(job_id=second.pk, event="job.failed")
    assert callbacks == []  # no longer chosen: no mail queued
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.on_job_notable(job_id=second.pk, event="job.held")
    assert len(callbacks) == 1  # the mail's task, queued after commit


def test_webhooks_are_managed_by_admins_and_their_log_shows_each_delivery(tenant, other_tenant, receivers,
                                                                         django_capture_on_commit_callbacks):
    receiver = receivers()
    admin, member = client_of(tenant, "admin"), client_of(tenant, "member")
    created = admin.post("/api/v1/webhooks/", {"url": receiver.url}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["secret"] == Webhook.objects.get().secret
    assert body["events"] == ["job.succeeded", "job.failed", "job.cancelled", "job.held"]
    listed = admin.get("/api/v1/webhooks/").json()["results"]
    assert "secret" not in listed[0]
    assert listed[0]["secret_hint"] == f"…{body['secret'][-4:]}"
    assert member.get("/api/v1/webhooks/").status_code == 403
    assert admin.post("/api/v1/webhooks/", {"url": "ftp://x.test/"}, format="json").status_code == 400
    end(make_job(tenant), "succeeded", django_capture_on_commit_callbacks)
    send_pending()
    log = admin.get(f"/api/v1/webhooks/{body['id']}/deliveries/").json()["results"]
    assert [(d["event"], d["state"], d["attempts"], d["response_status"]) for d in log] == [
        ("job.succeeded", "delivered", 1, 200)]
    other = webhook_create(organization=other_tenant.organization, user=other_tenant.admin, url=receiver.url,
                           events=["job.failed"])
    assert admin.get(f"/api/v1/webhooks/{other.pk}/deliveries/").status_code == 404
    assert admin.delete(f"/api/v1/webhooks/{other.pk}/").status_code == 404
    assert admin.delete(f"/api/v1/webhooks/{body['id']}/").status_code == 204
    assert list(Webhook.objects.values_list("organization", flat=True)) == [other_tenant.organization.pk]
