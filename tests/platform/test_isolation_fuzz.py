"""Isolation fuzzing (issue 10): schemathesis generates requests for every operation of the
OpenAPI schema at ``/api/schema/`` (valid and invalid bodies, queries and path ids) and sends them
with one organization's token, while another organization holds jobs, metrics, usage, datasets,
tokens and audit rows. No answer may be a server error, and none may carry anything of the other
organization (every one of its objects is named after it)."""

from __future__ import annotations

import io
import zipfile
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings

from accounts import services as accounts_services
from billing.models import UsageEntry
from billing.services import usage_totals_refresh
from config.wsgi import application
from jobs.models import Dataset, Job, JobMetric, JobState
from tests.platform.tenants import make_tenant

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
OTHER = "globex"  # the other organization: its slug, its users' names, its objects' names
STATUSES: Counter[int] = Counter()


@pytest.fixture
def acme_token(db) -> Iterator[str]:
    """A bearer token of acme's owner; globex's objects exist beside acme's. The WSGI calls run in
    the test's transaction: as Django's test client does, requests must not close the connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield _seed()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _seed() -> str:
    mine, theirs = make_tenant("acme"), make_tenant(OTHER)
    for tenant in (mine, theirs):
        name = tenant.organization.slug
        job = Job.objects.create(organization=tenant.organization, created_by=tenant.member, name=f"{name}-job",
                                 spec={"task": "arith", "steps": 3}, state=JobState.RUNNING,
                                 started_at=timezone.now())
        JobMetric.objects.create(job=job, step=1, seq=1, data={"reward": 0.5, "note": f"{name}-metric"})
        UsageEntry.objects.create(job=job, organization=tenant.organization, seq=2, call=1, role="policy",
                                  fn="generate", wpg=f"{name}-wpg", devices=1, start=1.0, end=2.0,
                                  device_seconds=1.0)
        usage_totals_refresh(job_id=job.pk)  # as the event ingest keeps them
        Dataset.objects.create(organization=tenant.organization, created_by=tenant.member, name=f"{name}-data",
                               size_bytes=10, problems=1, path=f"/srv/datasets/{name}.jsonl")
        accounts_services.token_create(user=tenant.viewer, organization=tenant.organization, name=f"{name}-token")
    _, plaintext = accounts_services.token_create(user=mine.owner, organization=mine.organization, name="fuzz")
    return plaintext


@schema.parametrize()
@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_no_request_errs_or_shows_another_organization(case, acme_token):
    response = case.call(headers={"Authorization": f"Bearer {acme_token}"})
    STATUSES[response.status_code] += 1
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.content[:500])
    body = _searchable(response)
    assert OTHER not in body, (case.method, case.formatted_path, body[:500])


def _searchable(response) -> str:
    """The answer as lower-case text to look for the other organization in. An archive is opened:
    every member's name and its uncompressed bytes are searched, since compression hides names in
    the raw body; bytes that are not text (event files) are read one character a byte."""
    if any(value.startswith("application/zip") for value in response.headers.get("content-type", [])):
        with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
            parts = [f"{info.filename}\n{archive.read(info).decode('latin-1')}" for info in archive.infolist()]
        return "\n".join(parts).lower()
    return response.content.decode("latin-1").lower()


def test_the_fuzzing_reached_the_views():
    """Runs after the fuzzing: most answers were the views' own (not all refused at the door)."""
    assert STATUSES, "the fuzzing test did not run"
    assert sum(n for status, n in STATUSES.items() if 200 <= status < 300) > 50, STATUSES
