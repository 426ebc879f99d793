"""How many queries an API read by token costs: bounded, whatever the organization holds. Every
request pays for authentication, so the token, its user, its organization and the membership come
in one query (``accounts.selectors.token_by_digest``)."""

from __future__ import annotations

import pytest

from accounts import services as account_services
from accounts.models import Role
from jobs import ingest, services
from jobs.models import JobMetric
from tests.platform.builders import SPEC

pytestmark = pytest.mark.django_db



@pytest.fixture
def jobs(tenant):
    made = [services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name=f"run {i}")
            for i in range(5)]
    for job in made:
        JobMetric.objects.bulk_create([JobMetric(job=job, step=s, seq=s, data={"step": s}) for s in (1, 2, 3)])
    return made


@pytest.fixture
def viewer(tenant, token_client):
    client = token_client(tenant.viewer, tenant.organization)
    client.get("/api/v1/quota/")  # the token's first use records last_used_at: not what is counted here
    return client


def test_the_job_list_takes_three_queries(jobs, viewer, django_assert_num_queries):
    with django_assert_num_queries(3):  # authentication, the count, the page
        response = viewer.get("/api/v1/jobs/")
    assert response.status_code == 200
    assert [j["last_step"] for j in response.json()["results"]] == [3] * 5


def test_a_job_takes_two_queries(jobs, viewer, django_assert_num_queries):
    with django_assert_num_queries(2):  # authentication, the job with its ledger totals (savings)
        response = viewer.get(f"/api/v1/jobs/{jobs[0].pk}/")
    assert response.status_code == 200


def test_a_continued_job_takes_two_queries_and_its_parent_three(jobs, viewer, django_assert_num_queries):
    from jobs.models import Job

    Job.objects.filter(pk=jobs[1].pk).update(parent=jobs[0], parent_weights="final")
    with django_assert_num_queries(2):  # its parent is joined
        assert viewer.get(f"/api/v1/jobs/{jobs[1].pk}/").json()["lineage"]["parent"]["id"] == jobs[0].pk
    with django_assert_num_queries(3):  # and the jobs that continued it, read once it has some
        assert viewer.get(f"/api/v1/jobs/{jobs[0].pk}/").json()["lineage"]["children"][0]["id"] == jobs[1].pk


def test_the_savings_report_takes_two_queries_however_long_the_ledger(jobs, viewer, django_assert_num_queries):
    """It reads each job's ledger totals, never the usage rows (thousands a job)."""
    ingest.ingest_events(job=jobs[0], events=[
        {"seq": 10 + i, "kind": "usage", "ts": 0.0, "data": {"call": i, "role": "policy", "fn": "generate",
                                                          "wpg": "g", "devices": 1.0, "start": i, "end": i + 0.5}}
        for i in range(50)])
    with django_assert_num_queries(2):  # authentication, the jobs with their ledger totals
        response = viewer.get("/api/v1/billing/savings/")
    assert response.status_code == 200
    report = {row["job"]: row for row in response.json()["jobs"]}
    assert report[jobs[0].pk]["billed_device_hours"] == pytest.approx(50 * 0.5 / 3600)
    assert report[jobs[1].pk]["billed_device_hours"] == 0.0


def test_the_role_read_with_the_token_is_current(tenant, viewer):
    """The membership comes with the token, so a role change applies to the next request."""
    assert viewer.post("/api/v1/jobs/", {"spec": SPEC}, format="json").status_code == 403
    account_services.member_set_role(organization=tenant.organization, actor=None, user=tenant.viewer,
                                     role=Role.MEMBER)
    assert viewer.post("/api/v1/jobs/", {"spec": SPEC}, format="json").status_code == 201
