"""Runs that continue from runs (issue 34), on the platform: ``continue_from`` a job of the same
organization, from its final weights or its latest checkpoint; the stored spec names the parent's
folders for the engine, the job records its parent, and both jobs show the lineage. (That the
continued job starts from the parent's weights is tests/engine/test_continue.)"""

from __future__ import annotations

import json

import pytest

from jobs import services
from jobs.models import Job
from tests.platform.builders import JOBS, ingest

pytestmark = pytest.mark.django_db

SPEC = {"task": "arith", "model": "tiny-arith", "steps": 3, "rollout": "torch", "trainer": "torch"}


@pytest.fixture
def parent(tenant, tmp_path):
    """A job of acme that logged a checkpoint and then its final weights."""
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name="parent")
    ingest(job,
           {"seq": 1, "kind": "checkpoint", "ts": 1.0, "data": {"step": 2, "tag": "step-2", "path": "/ck/step-2",
                                                                 "state": {}}},
           {"seq": 2, "kind": "artifact", "ts": 2.0, "data": {"name": "final", "path": str(tmp_path / "final"),
                                                               "files": ["config.json"]}})
    return job


def submit(client, **body):
    return client.post(JOBS, {"spec": {"task": "arith", "steps": 2, "rollout": "torch", "trainer": "torch"}, **body},
                       format="json")


def test_a_job_continues_from_the_final_weights_and_both_show_the_lineage(tenant, token_client, parent, tmp_path):
    client = token_client(tenant.member, tenant.organization)
    response = submit(client, name="child", continue_from=parent.pk)
    assert response.status_code == 201, response.json()
    child = Job.objects.get(pk=response.json()["id"])
    assert child.spec["model"] == str(tmp_path / "final")
    assert child.spec["init_from"] is None
    assert (child.parent, child.parent_weights) == (parent, "final")
    assert response.json()["lineage"] == {"parent": {"id": parent.pk, "name": "parent", "weights": "final"},
                                          "children": []}
    shown = client.get(f"{JOBS}{parent.pk}/").json()["lineage"]
    assert shown == {"parent": None, "children": [{"id": child.pk, "name": "child", "weights": "final"}]}


def test_a_job_continues_from_the_latest_checkpoint_with_the_parents_model(tenant, token_client, parent):
    response = submit(token_client(tenant.member, tenant.organization), continue_from=parent.pk,
                      continue_weights="checkpoint")
    assert response.status_code == 201, response.json()
    child = Job.objects.get(pk=response.json()["id"])
    assert (child.spec["model"], child.spec["init_from"]) == ("tiny-arith", "/ck/step-2")
    assert child.parent_weights == "checkpoint"


@pytest.mark.parametrize(
    ("case", "field", "message"),
    [
        ("other-organization", "continue_from", "no job"),
        ("unknown", "continue_from", "no job"),
        ("no-final", "continue_from", "has no final weights"),
        ("no-checkpoint", "continue_from", "has logged no checkpoint"),
        ("own-model", "spec.model", "trains its model; leave the model out"),
        ("hand-made-path", "spec.init_from", "set by continue_from"),
    ],
)
def test_what_a_job_cannot_continue_from_answers_400_and_creates_nothing(tenant, other_tenant, token_client,
                                                                          parent, case, field, message):
    client = token_client(tenant.member, tenant.organization)
    theirs = services.job_create(organization=other_tenant.organization, user=other_tenant.member, spec=SPEC)
    bare = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC)
    before = Job.objects.count()
    spec = {"task": "arith", "steps": 2}
    body = {
        "other-organization": {"continue_from": theirs.pk},
        "unknown": {"continue_from": theirs.pk + 100},
        "no-final": {"continue_from": bare.pk},
        "no-checkpoint": {"continue_from": bare.pk, "continue_weights": "checkpoint"},
        "own-model": {"continue_from": parent.pk, "spec": {**spec, "model": "tiny-arith"}},
        "hand-made-path": {"spec": {**spec, "init_from": "/ck/step-2"}},
    }[case]
    response = client.post(JOBS, {"spec": spec, **body}, format="json")
    assert response.status_code == 400
    assert message in response.json()[field][0], response.json()
    assert Job.objects.count() == before
    assert "/ck/" not in json.dumps(response.json())  # no path of another job leaks


def test_the_estimate_validates_the_continuation_as_the_submission_does(tenant, token_client, parent, other_tenant):
    theirs = services.job_create(organization=other_tenant.organization, user=other_tenant.member, spec=SPEC)
    client = token_client(tenant.member, tenant.organization)
    spec = {"task": "arith", "steps": 2, "rollout": "torch", "trainer": "torch"}
    ok = client.post(f"{JOBS}estimate/", {"spec": spec, "continue_from": parent.pk}, format="json")
    assert ok.status_code == 200, ok.json()
    refused = client.post(f"{JOBS}estimate/", {"spec": spec, "continue_from": theirs.pk}, format="json")
    assert refused.status_code == 400
    assert "continue_from" in refused.json()
