"""``GET cluster/``: every active job of the cluster, from the database. Staff see everything; anyone
else sees their organization's jobs in full and the others' anonymised (state and devices only)."""

import json
import time

import pytest
from django.utils import timezone

from jobs import ingest, services
from jobs.models import Job, JobState
from tests.platform.builders import SPEC
from tests.platform.factories import UserFactory

pytestmark = pytest.mark.django_db

CLUSTER = "/api/v1/cluster/"


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
    body = token_client(tenant.member, tenant.organization).get(CLUSTER).json()
    timeline = body.pop("timeline")
    assert body == {"jobs": [], "active_jobs": 0, "reserved_devices": 0, "utilisation": []}
    assert timeline["until"] - timeline["since"] == 600
    assert abs(timeline["until"] - time.time()) < 60
    assert (timeline["intervals"], timeline["truncated"]) == ([], False)


# --- the device timeline ---------------------------------------------------------------------------


def ran(job: Job, *calls: tuple[int, str, float, float, float]) -> None:
    """Ingest usage events ``(seq, wpg, seconds ago it started, seconds ago it ended, devices)``."""
    now = time.time()
    ingest.ingest_events(job=job, events=[
        {"seq": seq, "kind": "usage", "ts": now - end, "data": {
            "role": "policy", "fn": "generate", "wpg": wpg, "devices": devices, "start": now - start,
            "end": now - end, "call": seq}}
        for seq, wpg, start, end, devices in calls])  # fmt: skip


@pytest.fixture
def timeline_jobs(jobs):
    ran(jobs["mine"], (1, "rollout-0", 100.0, 40.0, 2.0), (2, "train-0", 2000.0, 1000.0, 4.0))
    ran(jobs["theirs"], (1, "rollout-0", 50.0, 20.0, 2.0), (2, "train-0", 700.0, 550.0, 4.0))
    return jobs


def test_the_timeline_lists_recent_intervals_and_anonymises_other_organizations(tenant, timeline_jobs,
                                                                                 token_client):
    body = token_client(tenant.viewer, tenant.organization).get(CLUSTER).json()
    intervals = body["timeline"]["intervals"]  # ended in the last 600 s, by start
    assert [(i["wpg"], i["own"]) for i in intervals] == [("train-0", False), ("rollout-0", True),
                                                         ("rollout-0", False)]
    train, mine, theirs = intervals
    assert set(mine) == {"seq", "wpg", "job", "name", "organization", "own", "fn", "role", "devices", "start",
                         "end"}
    assert (mine["job"], mine["name"], mine["organization"]) == (timeline_jobs["mine"].pk, "mine", "Acme")
    for interval in (train, theirs):
        assert (interval["job"], interval["name"], interval["organization"]) == (None, None, None)
        assert interval["fn"] == "generate"
    assert mine["end"] - mine["start"] == pytest.approx(60.0)
    text = json.dumps(body)
    assert "secret-project" not in text
    assert "Globex" not in text
    # rollout-0 was busy from 100 s ago to 20 s ago (the two calls overlap); train-0 from the start of
    # the window to 550 s ago
    assert body["utilisation"] == [
        {"wpg": "rollout-0", "devices": 2.0, "busy_fraction": pytest.approx(80 / 600, abs=1e-3)},
        {"wpg": "train-0", "devices": 4.0, "busy_fraction": pytest.approx(50 / 600, abs=1e-3)},
    ]


def test_staff_see_every_interval_in_full(tenant, timeline_jobs, token_client):
    tenant.admin.is_staff = True
    tenant.admin.save()
    intervals = token_client(tenant.admin, tenant.organization).get(CLUSTER).json()["timeline"]["intervals"]
    assert [(i["name"], i["organization"]) for i in intervals] == [
        ("secret-project", "Globex"), ("mine", "Acme"), ("secret-project", "Globex")]


def test_the_timeline_window_is_a_query_parameter(tenant, timeline_jobs, token_client):
    client = token_client(tenant.viewer, tenant.organization)
    body = client.get(CLUSTER, {"window": 30}).json()
    assert [i["wpg"] for i in body["timeline"]["intervals"]] == ["rollout-0"]
    assert body["timeline"]["until"] - body["timeline"]["since"] == 30
    assert len(client.get(CLUSTER, {"window": 86400}).json()["timeline"]["intervals"]) == 4
    for bad in ("0", "86401", "ten", "-5"):
        response = client.get(CLUSTER, {"window": bad})
        assert response.status_code == 400, bad
        assert "window" in response.json()
