"""A session's calls are served by plain Django views (``jobs.session_views.session_calls`` and
``session_call_answer``) where the DRF views would take them to the engine, and by those DRF views
otherwise, so that every refusal answers as it always has. No engine: each case here is refused
before one would be reached, or checked at the point of admission (``_admitted``)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import token_create
from jobs import selectors, session_views
from jobs.models import Job, JobState
from tests.platform.builders import SPEC

pytestmark = pytest.mark.django_db

SESSION_SPEC = {**SPEC, "algorithm": "session"}


def session_of(tenant, role: str, *, state: str = JobState.RUNNING, spec=SESSION_SPEC) -> Job:
    return Job.objects.create(organization=tenant.organization, created_by=tenant.user(role), name=f"{role}-session",
                              spec=spec, state=state, started_at=timezone.now())


def bearer(tenant, role: str) -> str:
    return token_create(user=tenant.user(role), organization=tenant.organization, name="sdk")[1]


def admitted(job: Job, authorization: str, method: str = "POST") -> str | None:
    factory = RequestFactory()
    make = factory.post if method == "POST" else factory.get
    request = make("/", HTTP_AUTHORIZATION=authorization)
    view = session_views.SessionCallsView if method == "POST" else session_views.SessionCallAnswerView
    return session_views._admitted(request, view, job.pk)


@pytest.mark.parametrize(("caller", "owner", "method", "taken"), [
    ("member", "member", "POST", True),  # a member's own session
    ("member", "member", "GET", True),
    ("admin", "member", "POST", True),  # admins and owners call anyone's
    ("owner", "member", "GET", True),
    ("member", "admin", "POST", False),  # not a member's to call: the DRF view answers 403
    ("viewer", "viewer", "POST", False),  # viewers make no calls
    ("viewer", "viewer", "GET", False),
])
def test_the_short_path_takes_the_calls_of_those_who_may_make_them(tenant, caller, owner, method, taken):
    job = session_of(tenant, owner)
    assert admitted(job, f"Bearer {bearer(tenant, caller)}", method) == (job.engine_id if taken else None)


def test_the_short_path_leaves_every_other_request_to_the_drf_view(tenant, other_tenant):
    job = session_of(tenant, "member")
    token = bearer(tenant, "member")
    assert admitted(job, f"Bearer {token}") == job.engine_id
    refused = {
        "another organization's token": f"Bearer {bearer(other_tenant, 'owner')}",
        "no token": "",
        "a malformed header": f"Bearer {token} extra",
        "another scheme": f"Basic {token}",
        "an unknown token": "Bearer plx_nope",
        "a non-ASCII token": "Bearer plx_é",
    }
    for why, authorization in refused.items():
        assert admitted(job, authorization) is None, why
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert admitted(job, f"Bearer {token}") is None, "an expired token"
    ApiToken.objects.update(expires_at=None, revoked_at=timezone.now())
    assert admitted(job, f"Bearer {token}") is None, "a revoked token"
    fresh = bearer(tenant, "member")
    for job, why in ((session_of(tenant, "member", state=JobState.SUCCEEDED), "a closed session"),
                     (session_of(tenant, "member", spec=SPEC), "a job that is no session")):
        assert admitted(job, f"Bearer {fresh}") is None, why


@pytest.mark.parametrize(("body", "errors"), [
    ({"seq": 0, "fn": "shell"}, {"seq", "fn"}),
    ({"seq": 1, "fn": "optim_step", "wait": 61}, {"wait"}),
    ({"seq": 1, "fn": "optim_step", "args": []}, {"args"}),
    ({"seq": 1, "fn": "optim_step", "extra": 1}, {"extra"}),
])
def test_bad_input_to_an_open_session_answers_the_drf_views_field_errors(tenant, body, errors):
    job = session_of(tenant, "member")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {bearer(tenant, 'member')}")
    answer = client.post(f"/api/v1/sessions/{job.pk}/calls/", body, format="json")
    assert answer.status_code == 400
    assert set(answer.json()) == errors
    not_json = client.post(f"/api/v1/sessions/{job.pk}/calls/", "seq=1", content_type="application/json")
    assert not_json.status_code == 400
    assert "JSON" in json.dumps(not_json.json())


def test_the_job_read_builds_the_instance_the_orm_does(tenant):
    job = session_of(tenant, "member")
    read, orm = selectors.job_row(organization=tenant.organization, pk=job.pk), Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(read, field.attname) == getattr(orm, field.attname), field.name
    assert read._state.adding is False  # saved as a fetched instance would be
    assert selectors.job_row(organization=tenant.organization, pk=str(job.pk)).pk == job.pk
