"""``GET cluster/``: every active job of the cluster, from the database. Staff see everything; anyone
else sees their organization's jobs in full and the others' anonymised (state and devices only)."""

import json

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobState
from tests.platform.factories import UserFactory

pytestmark = pytest.mark.django_db

CLUSTER = "/api/v1/cluster/"
SPEC = {"task": "arith", "steps": 3}


def make_job(tenant, *, name, state=JobState.QUEUED, rollout=1, train=1) -> Job:
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name=name,
                              rollout_devices=rollout, train_devices=train)
    if state != JobState.QUEUED:
        Job.objects.filter(pk=job.pk).update(state=state, started_at=timezone.now())
    return job


@pytest.fixture
def jobs(tenant, other_tenant):
    return {
        "mine": make_job(tenant, name="mine", state=JobState.RUNNING, rollout=2, train=3),
        "theirs": make_job(other_tenant, name="secret-project", state=JobState.PAUSED, rollout=1, train=4),
        "done": make_job(other_tenant, name="done", state=JobState.SUCCEEDED),
        "queued": make_job(tenant, name="queued"),
    }


def test_a_member_sees_their_jobs_in_full_and_the_others_anonymised(tenant, jobs, token_client):
    response = token_client(tenant.viewer, tenant.organization).get(CLUSTER)
    assert response.status_code == 200
    body = response.json()
    assert (body["active_jobs"], body["reserved_devices"]) == (3, 5 + 5 + 2)
    mine, theirs, queued = body["jobs"]  # queue order: oldest first; the finished job is not listed
    assert mine == {
        "job": jobs["mine"].pk, "name": "mine", "organization": "Acme", "state": "running",
        "created_at": mine["created_at"], "reserved_devices": 5, "own": True,
    }  # fmt: skip
    assert mine["created_at"] is not None
    assert theirs == {
        "job": None, "name": None, "organization": None, "state": "paused", "created_at": None,
        "reserved_devices": 5, "own": False,
    }  # fmt: skip
    assert queued["job"] == jobs["queued"].pk
    text = json.dumps(body)
    assert "secret-project" not in text
    assert "Globex" not in text


def test_staff_see_every_job_in_full(tenant, other_tenant, jobs, token_client):
    tenant.admin.is_staff = True
    tenant.admin.save()
    body = token_client(tenant.admin, tenant.organization).get(CLUSTER).json()
    assert [(j["job"], j["organization"], j["own"]) for j in body["jobs"]] == [
        (jobs["mine"].pk, "Acme", True),
        (jobs["theirs"].pk, "Globex", False),
        (jobs["queued"].pk, "Acme", True),
    ]
    assert body["jobs"][1]["name"] == "secret-project"


def test_staff_without_an_organization_see_everything(jobs, session_client):
    root = UserFactory(username="root", is_staff=True)
    body = session_client(root).get(CLUSTER).json()
    assert [j["organization"] for j in body["jobs"]] == ["Acme", "Globex", "Acme"]
    assert not any(j["own"] for j in body["jobs"])


def test_the_cluster_needs_an_organization_or_staff(jobs, session_client, api_client):
    assert api_client.get(CLUSTER).status_code in (401, 403)
    assert session_client(UserFactory(username="loner")).get(CLUSTER).status_code == 403


def test_an_empty_cluster(tenant, token_client):
    assert token_client(tenant.member, tenant.organization).get(CLUSTER).json() == {
        "jobs": [], "active_jobs": 0, "reserved_devices": 0,
    }  # fmt: skip
