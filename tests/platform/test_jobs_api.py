"""The jobs REST API with two tenants: create (validated by the engine's JobSpec, quota-checked),
list, detail, cancel/pause/resume, metrics and events.

Another organization's job answers 404 on every endpoint and is never listed; viewers cannot write
(403); malformed input answers 400 field by field and creates nothing; quota and state conflicts
answer 409. Nothing is sent to Celery: ``job_create`` sends on commit, and these tests run inside a
transaction that never commits.
"""

import datetime as dt

import pytest
from django.utils import timezone

from accounts import services as account_services
from accounts.models import AuditLog, Role
from jobs import services
from jobs.models import Job, JobEvent, JobMetric, JobState
from tests.platform.builders import JOBS, SPEC, ingest, metrics_event, state_event, usage_event
from tests.platform.factories import MembershipFactory, UserFactory
from tests.platform.tenants import give_plan

pytestmark = pytest.mark.django_db

def job_url(job, action: str = "") -> str:
    return f"{JOBS}{job.pk}/{action + '/' if action else ''}"


def make_job(tenant, *, user=None, state=JobState.QUEUED, name="run", **fields) -> Job:
    """A job created through the service (as the API would), then put in ``state``."""
    job = services.job_create(
        organization=tenant.organization, user=user or tenant.member, spec=SPEC, name=name, **fields
    )
    if state != JobState.QUEUED:
        Job.objects.filter(pk=job.pk).update(state=state, started_at=timezone.now())
        job.refresh_from_db()
    return job


# --- create -------------------------------------------------------------------------------------


def test_create_a_job(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    payload = {"name": "arith-3", "spec": SPEC, "rollout_devices": 2, "train_devices": 3}
    payload["deployment_mode"] = "colocated"
    response = client.post(JOBS, payload, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    job = Job.objects.get()
    assert body["id"] == job.pk
    assert (job.organization, job.created_by, job.name, job.state) == (
        tenant.organization,
        tenant.member,
        "arith-3",
        JobState.QUEUED,
    )
    assert set(body) == {
        "id", "name", "state", "state_reason", "rollout_devices", "train_devices", "reserved_devices",
        "deployment_mode", "priority", "waiting_for_slot", "created_by", "created_at", "started_at",
        "finished_at", "last_step", "latest_reward", "eval_accuracy", "device_hours", "spec", "paused_by_quota",
        "updated_at", "savings", "estimate", "lineage",
    }  # fmt: skip
    assert (body["state"], body["created_by"], body["reserved_devices"], body["last_step"]) == (
        "queued",
        "acme-member",
        5,
        None,
    )
    assert (body["rollout_devices"], body["train_devices"], body["deployment_mode"]) == (2, 3, "colocated")
    assert body["spec"]["steps"] == 3
    assert body["spec"]["model"] == "tiny-arith"  # normalised by the engine's JobSpec: the task's default
    assert body["savings"] == {
        "billed_device_hours": 0.0,
        "counterfactual_device_hours": 0.0,
        "isolated_wall_seconds": 0.0,
        "savings": None,
        "redone_device_hours": 0.0,
    }
    row = AuditLog.objects.get(action="job.created")
    assert (row.organization, row.actor, row.target) == (tenant.organization, tenant.member, job.engine_id)


def test_create_with_only_a_spec_takes_the_defaults(tenant, session_client):
    response = session_client(tenant.owner).post(JOBS, {"spec": {}}, format="json")  # a browser session works too
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["name"], body["rollout_devices"], body["train_devices"], body["deployment_mode"]) == (
        "",
        1,
        1,
        "async_split",
    )
    assert body["spec"]["task"] == "arith"


def test_create_refuses_an_unknown_model(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    response = client.post(JOBS, {"spec": {"task": "arith", "model": "no-such-model"}}, format="json")
    assert response.status_code == 400
    message = response.json()["spec.model"][0]
    assert "unknown model 'no-such-model'" in message
    assert "tiny-arith" in message  # the known ones are named
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({"name": "no spec"}, {"spec"}),
        ({"spec": SPEC, "priority": 5}, {"priority"}),
        ({"spec": SPEC, "state": "running"}, {"state"}),
        ({"spec": "arith"}, {"spec"}),
        ({"spec": [SPEC]}, {"spec"}),
        ({"spec": None}, {"spec"}),
        ({"spec": {"task": "arith", "steps": 0}}, {"spec.steps"}),
        ({"spec": {"task": "arith", "steps": "many"}}, {"spec.steps"}),
        ({"spec": {"task": "arith", "steps": -1}}, {"spec.steps"}),
        ({"spec": {"task": "chess"}}, {"spec.task"}),
        ({"spec": {"task": "arith", "seed": -1}}, {"spec.seed"}),
        ({"spec": {"task": "arith", "algorithm": "ppo"}}, {"spec.algorithm"}),
        ({"spec": {"task": "arith", "tp": 99}}, {"spec.tp"}),
        ({"spec": {"task": "arith", "rollout": "tensorrt"}}, {"spec.rollout"}),
        ({"spec": {"task": "arith", "stepz": 3}}, {"spec.stepz"}),
        ({"spec": SPEC, "rollout_devices": "two"}, {"rollout_devices"}),
        ({"spec": SPEC, "rollout_devices": 0}, {"rollout_devices"}),
        ({"spec": SPEC, "train_devices": 10**6}, {"train_devices"}),
        ({"spec": SPEC, "deployment_mode": "shared"}, {"deployment_mode"}),
        ({"spec": SPEC, "name": "x" * 201}, {"name"}),
        ({"spec": SPEC, "name": ["x"]}, {"name"}),
        ({"spec": SPEC, "extra": 1, "train_devices": 0}, {"extra"}),
    ],
    ids=[
        "missing-spec", "extra-field", "read-only-field", "spec-string", "spec-list", "spec-null", "steps-0",
        "steps-many", "steps-negative", "unknown-task", "seed-negative", "unknown-algorithm", "tp-too-big",
        "unknown-backend", "unknown-spec-key", "devices-string", "devices-0", "devices-too-many", "unknown-mode",
        "name-too-long", "name-list", "extra-first",
    ],
)  # fmt: skip
def test_create_rejects_malformed_input_and_creates_nothing(tenant, token_client, payload, fields):
    client = token_client(tenant.member, tenant.organization)
    audit_before = AuditLog.objects.count()
    response = client.post(JOBS, payload, format="json")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == fields
    assert all(isinstance(messages, list) and messages for messages in body.values())
    assert not Job.objects.exists()
    assert AuditLog.objects.count() == audit_before


def test_create_needs_a_json_object_body(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    response = client.post(JOBS, "[1, 2]", content_type="application/json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_viewers_cannot_create_jobs(tenant, token_client):
    response = token_client(tenant.viewer, tenant.organization).post(JOBS, {"spec": SPEC}, format="json")
    assert response.status_code == 403
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("quota", "payload", "limit"),
    [
        ({"max_devices_per_job": 2}, {"spec": SPEC, "rollout_devices": 2, "train_devices": 1}, "max_devices_per_job"),
        ({"device_hours_per_month": 0}, {"spec": SPEC}, "device_hours_per_month"),
        ({"max_priority": "normal"}, {"spec": SPEC, "priority": "high"}, "max_priority"),
    ],
    ids=["devices-per-job", "device-hours", "priority"],
)
def test_create_over_quota_answers_409_and_creates_nothing(tenant, token_client, quota, payload, limit):
    give_plan(tenant.organization, **quota)
    before = Job.objects.count()
    response = token_client(tenant.member, tenant.organization).post(JOBS, payload, format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["limit"] == limit
    assert isinstance(body["detail"], str)
    assert body["detail"]
    assert Job.objects.count() == before


def test_finished_jobs_and_other_tenants_jobs_do_not_count_against_concurrency(tenant, other_tenant, token_client):
    make_job(tenant, state=JobState.SUCCEEDED)
    make_job(tenant, state=JobState.CANCELLED)
    make_job(other_tenant, state=JobState.RUNNING)
    give_plan(tenant.organization, max_concurrent_jobs=1, max_devices_per_job=2)
    response = token_client(tenant.member, tenant.organization).post(JOBS, {"spec": SPEC}, format="json")
    assert response.status_code == 201
    assert (response.json()["state"], response.json()["waiting_for_slot"]) == ("queued", False)


def test_past_the_concurrent_job_limit_a_job_waits_queued_with_its_reason(tenant, token_client):
    make_job(tenant, state=JobState.PAUSED)  # paused jobs keep their slot
    give_plan(tenant.organization, max_concurrent_jobs=1)
    client = token_client(tenant.member, tenant.organization)
    response = client.post(JOBS, {"spec": SPEC, "name": "second"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["state"], body["waiting_for_slot"]) == ("queued", True)
    assert "waiting for a slot" in body["state_reason"]
    listed = client.get(JOBS).json()["results"][0]
    assert (listed["name"], listed["waiting_for_slot"], listed["state_reason"]) == ("second", True,
                                                                                     body["state_reason"])
    assert client.get("/api/v1/quota/").json()["usage"]["queued_jobs"] == 1


# --- list and detail -----------------------------------------------------------------------------


def test_list_holds_this_organizations_jobs_only(tenant, other_tenant, token_client):
    mine = [make_job(tenant, name="alpha"), make_job(tenant, name="beta", state=JobState.RUNNING)]
    make_job(other_tenant, name="alpha-theirs")
    response = token_client(tenant.viewer, tenant.organization).get(JOBS)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [row["id"] for row in body["results"]] == [mine[1].pk, mine[0].pk]  # newest first
    assert "spec" not in body["results"][0]
    assert "alpha-theirs" not in response.content.decode()


def test_list_filters_by_state_and_name(tenant, token_client):
    queued = make_job(tenant, name="Arith small")
    running = make_job(tenant, name="arith big", state=JobState.RUNNING)
    make_job(tenant, name="tools", state=JobState.RUNNING)
    client = token_client(tenant.viewer, tenant.organization)

    def ids(query):
        response = client.get(JOBS, query)
        assert response.status_code == 200
        return {row["id"] for row in response.json()["results"]}

    assert ids({"state": "running", "search": "arith"}) == {running.pk}
    assert ids({"search": "ARITH"}) == {queued.pk, running.pk}
    assert ids({"state": "queued"}) == {queued.pk}
    assert ids({"state": "failed"}) == set()
    assert len(ids({"state": "", "search": ""})) == 3


def test_list_rejects_an_unknown_state(tenant, token_client):
    response = token_client(tenant.viewer, tenant.organization).get(JOBS, {"state": "sleeping"})
    assert response.status_code == 400
    assert set(response.json()) == {"state"}


def test_list_is_paginated(tenant, token_client):
    for i in range(3):
        make_job(tenant, name=f"j{i}")
    body = token_client(tenant.viewer, tenant.organization).get(JOBS, {"page_size": 2}).json()
    assert (body["count"], len(body["results"])) == (3, 2)
    assert body["next"] is not None


def test_detail_shows_progress_and_savings(tenant, token_client):
    job = make_job(tenant, rollout_devices=1, train_devices=1)
    ingest(
        job,
        state_event(1, "running"),
        metrics_event(2, 1),
        metrics_event(3, 2),
        usage_event(4, job=job, start=10.0, end=14.0, devices=1.0),
    )
    response = token_client(tenant.viewer, tenant.organization).get(job_url(job))
    assert response.status_code == 200
    body = response.json()
    assert body["last_step"] == 2
    assert body["started_at"] is not None
    assert body["savings"]["billed_device_hours"] == pytest.approx(4 / 3600)
    assert body["savings"]["counterfactual_device_hours"] == pytest.approx(2 * 4 / 3600)
    assert body["savings"]["savings"] == pytest.approx(0.5)


# --- tenancy and authentication ------------------------------------------------------------------

ENDPOINTS = [
    ("get", ""),
    ("get", "metrics"),
    ("get", "events"),
    ("post", "cancel"),
    ("post", "pause"),
    ("post", "resume"),
]


@pytest.mark.parametrize(("method", "action"), ENDPOINTS)
def test_another_organizations_job_answers_404(tenant, other_tenant, token_client, method, action):
    theirs = make_job(other_tenant, state=JobState.PAUSED)
    ingest(theirs, metrics_event(1, 1), state_event(2, "running"))
    client = token_client(tenant.owner, tenant.organization)
    response = getattr(client, method)(job_url(theirs, action), format="json")
    assert response.status_code == 404
    assert "reward" not in response.content.decode()
    theirs.refresh_from_db()
    assert theirs.state == JobState.PAUSED
    assert not AuditLog.objects.filter(organization=other_tenant.organization).exclude(action="job.created").exists()


@pytest.mark.parametrize(("method", "action"), ENDPOINTS)
def test_a_job_that_is_not_there_answers_404(tenant, token_client, method, action):
    client = token_client(tenant.owner, tenant.organization)
    assert getattr(client, method)(f"{JOBS}999999/{action + '/' if action else ''}").status_code == 404


def test_another_organization_member_with_a_session_still_sees_only_the_current_one(
    tenant, other_tenant, session_client
):
    # A user in both tenants acts in the session's current organization only.
    MembershipFactory(user=tenant.member, organization=other_tenant.organization, role=Role.OWNER)
    theirs = make_job(other_tenant)
    client = session_client(tenant.member)  # current: acme (the lowest id)
    assert client.get(job_url(theirs)).status_code == 404
    assert client.get(JOBS).json()["count"] == 0


@pytest.mark.parametrize("action", ["cancel", "pause", "resume"])
def test_viewers_cannot_act_on_jobs(tenant, token_client, action):
    job = make_job(tenant, state=JobState.PAUSED if action == "resume" else JobState.RUNNING)
    response = token_client(tenant.viewer, tenant.organization).post(job_url(job, action), format="json")
    assert response.status_code == 403
    before = job.state
    job.refresh_from_db()
    assert job.state == before


def test_members_act_on_their_own_jobs_and_admins_on_anyones(tenant, token_client):
    colleagues = make_job(tenant, user=tenant.owner, state=JobState.RUNNING)
    member = token_client(tenant.member, tenant.organization)
    assert member.post(job_url(colleagues, "pause")).status_code == 403
    assert member.post(job_url(colleagues, "cancel")).status_code == 403
    colleagues.refresh_from_db()
    assert colleagues.state == JobState.RUNNING
    admin = token_client(tenant.admin, tenant.organization)
    assert admin.post(job_url(colleagues, "pause")).status_code == 200
    own = make_job(tenant, user=tenant.member)
    assert member.post(job_url(own, "cancel")).status_code == 200


def test_anonymous_requests_answer_401(tenant, api_client):
    job = make_job(tenant)
    assert api_client.get(JOBS).status_code == 401
    assert api_client.get(job_url(job)).status_code == 401
    assert api_client.post(JOBS, {"spec": SPEC}, format="json").status_code == 401
    assert Job.objects.count() == 1


def test_a_revoked_or_expired_token_answers_401(tenant, token_client):
    job = make_job(tenant)
    revoked = token_client(tenant.owner, tenant.organization)
    account_services.token_revoke(token=revoked.token, actor=tenant.owner)
    expired = token_client(tenant.owner, tenant.organization, expires_in_days=1)
    type(expired.token).objects.filter(pk=expired.token.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    for client in (revoked, expired):
        assert client.get(JOBS).status_code == 401
        assert client.post(JOBS, {"spec": SPEC}, format="json").status_code == 401
        assert client.post(job_url(job, "cancel")).status_code == 401
    assert Job.objects.count() == 1


def test_a_removed_members_token_answers_401(tenant, token_client):
    user = UserFactory(username="leaver")
    MembershipFactory(user=user, organization=tenant.organization, role=Role.MEMBER)
    client = token_client(user, tenant.organization)
    assert client.get(JOBS).status_code == 200
    account_services.member_remove(organization=tenant.organization, actor=tenant.owner, user=user)
    assert client.get(JOBS).status_code == 401


# --- transitions ---------------------------------------------------------------------------------


def test_cancel_with_a_reason(tenant, token_client):
    job = make_job(tenant, state=JobState.RUNNING)
    client = token_client(tenant.member, tenant.organization)
    response = client.post(job_url(job, "cancel"), {"reason": "wrong learning rate"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["state"], body["state_reason"]) == ("cancelled", "wrong learning rate")
    assert body["finished_at"] is not None
    assert AuditLog.objects.filter(action="job.cancelled", target=job.engine_id, actor=tenant.member).exists()
    again = client.post(job_url(job, "cancel"), format="json")
    assert again.status_code == 409
    assert set(again.json()) == {"detail"}
    assert "cancelled" in again.json()["detail"]


def test_cancel_without_a_reason_names_the_actor(tenant, token_client):
    job = make_job(tenant)
    response = token_client(tenant.member, tenant.organization).post(job_url(job, "cancel"))
    assert response.status_code == 200
    assert response.json()["state_reason"] == "cancelled by acme-member"


@pytest.mark.parametrize(
    ("action", "payload", "fields"),
    [
        ("cancel", {"reason": "x", "force": True}, {"force"}),
        ("cancel", {"reason": ["x"]}, {"reason"}),
        ("cancel", {"reason": "x" * 1001}, {"reason"}),
        ("pause", {"reason": "x"}, {"reason"}),
        ("resume", {"now": True}, {"now"}),
    ],
    ids=["cancel-extra", "cancel-reason-list", "cancel-reason-long", "pause-extra", "resume-extra"],
)
def test_actions_reject_malformed_input(tenant, token_client, action, payload, fields):
    job = make_job(tenant, state=JobState.PAUSED if action == "resume" else JobState.RUNNING)
    before = job.state
    response = token_client(tenant.member, tenant.organization).post(job_url(job, action), payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    job.refresh_from_db()
    assert job.state == before


def test_pause_and_resume(tenant, token_client):
    job = make_job(tenant, state=JobState.RUNNING)
    client = token_client(tenant.member, tenant.organization)
    paused = client.post(job_url(job, "pause"))
    assert paused.status_code == 200
    assert (paused.json()["state"], paused.json()["paused_by_quota"]) == ("paused", False)
    assert client.post(job_url(job, "pause")).status_code == 409
    resumed = client.post(job_url(job, "resume"))
    assert resumed.status_code == 200
    assert resumed.json()["state"] == "running"  # it had started
    conflict = client.post(job_url(job, "resume"))
    assert conflict.status_code == 409
    assert "only a paused job" in conflict.json()["detail"]
    actions = list(AuditLog.objects.filter(target=job.engine_id).order_by("id").values_list("action", flat=True))
    assert actions == ["job.created", "job.paused", "job.resumed"]


def test_a_job_that_never_started_resumes_queued(tenant, token_client):
    job = make_job(tenant)
    client = token_client(tenant.member, tenant.organization)
    assert client.post(job_url(job, "pause")).json()["state"] == "paused"
    assert client.post(job_url(job, "resume")).json()["state"] == "queued"


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
@pytest.mark.parametrize("action", ["cancel", "pause", "resume"])
def test_finished_jobs_cannot_change(tenant, token_client, state, action):
    job = make_job(tenant, state=state)
    response = token_client(tenant.member, tenant.organization).post(job_url(job, action))
    assert response.status_code == 409
    assert response.json()["detail"]
    job.refresh_from_db()
    assert job.state == state


# --- metrics and events --------------------------------------------------------------------------


def test_metrics_are_listed_by_step(tenant, other_tenant, token_client):
    job = make_job(tenant)
    ingest(job, state_event(1, "running"), metrics_event(2, 1, loss=0.9), metrics_event(3, 2, loss=0.7))
    theirs = make_job(other_tenant)
    ingest(theirs, metrics_event(1, 1, loss=0.1))
    response = token_client(tenant.viewer, tenant.organization).get(job_url(job, "metrics"))
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [row["step"] for row in body["results"]] == [1, 2]
    assert body["results"][1] == {"step": 2, "data": {"step": 2, "reward": 0.5, "loss": 0.7}}
    assert JobMetric.objects.count() == 3


def test_metrics_download_as_jsonl_a_step_a_line_with_sorted_keys(tenant, other_tenant, token_client):
    job = make_job(tenant)
    ingest(job, metrics_event(2, 2, loss=0.7), metrics_event(1, 1, loss=0.25))
    viewer = token_client(tenant.viewer, tenant.organization)
    response = viewer.get(job_url(job, "metrics"), {"format": "jsonl"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/jsonl")
    assert response.content == (b'{"loss": 0.25, "reward": 0.5, "step": 1}\n'
                                b'{"loss": 0.7, "reward": 0.5, "step": 2}\n')
    by_accept = viewer.get(job_url(job, "metrics"), HTTP_ACCEPT="application/jsonl")
    assert by_accept.content == response.content
    assert viewer.get(job_url(make_job(tenant), "metrics"), {"format": "jsonl"}).content == b""
    theirs = token_client(other_tenant.viewer, other_tenant.organization)
    assert theirs.get(job_url(job, "metrics"), {"format": "jsonl"}).status_code == 404


def test_events_are_listed_by_seq_from_a_cursor(tenant, token_client):
    job = make_job(tenant)
    ingest(
        job,
        state_event(1, "running", ts=1.0),
        metrics_event(2, 1),
        {"seq": 3, "kind": "log", "ts": 3.0, "data": {"message": "hello"}},
        usage_event(4, job=job),
        state_event(5, "succeeded", ts=5.0),
    )
    client = token_client(tenant.viewer, tenant.organization)
    body = client.get(job_url(job, "events")).json()
    assert [(row["seq"], row["kind"]) for row in body["results"]] == [(1, "state"), (3, "log"), (5, "state")]
    assert body["results"][0] == {"seq": 1, "kind": "state", "data": {"state": "running"}, "ts": 1.0}
    assert [row["seq"] for row in client.get(job_url(job, "events"), {"after_seq": 1}).json()["results"]] == [3, 5]
    states = client.get(job_url(job, "events"), {"kind": "state", "after_seq": 0}).json()["results"]
    assert [row["data"]["state"] for row in states] == ["running", "succeeded"]
    assert client.get(job_url(job, "events"), {"after_seq": 5}).json()["count"] == 0
    assert JobEvent.objects.filter(job=job).count() == 3
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED


@pytest.mark.parametrize("query", [{"after_seq": "soon"}, {"after_seq": -1}])
def test_events_reject_a_bad_cursor(tenant, token_client, query):
    job = make_job(tenant)
    response = token_client(tenant.viewer, tenant.organization).get(job_url(job, "events"), query)
    assert response.status_code == 400
    assert set(response.json()) == {"after_seq"}


def test_the_schema_describes_the_jobs_and_billing_api(client):
    paths = client.get("/api/schema/", {"format": "json"}).json()["paths"]
    assert {
        "/api/v1/jobs/",
        "/api/v1/jobs/{job_id}/",
        "/api/v1/jobs/{job_id}/cancel/",
        "/api/v1/jobs/{job_id}/pause/",
        "/api/v1/jobs/{job_id}/resume/",
        "/api/v1/jobs/{job_id}/metrics/",
        "/api/v1/jobs/{job_id}/events/",
        "/api/v1/billing/usage/",
        "/api/v1/billing/savings/",
    } <= set(paths)
    assert set(paths["/api/v1/jobs/"]["post"]["responses"]) >= {"201", "409"}
    assert set(paths["/api/v1/billing/savings/"]["get"]["responses"]["200"]["content"]) == {
        "application/json",
        "text/csv",
    }


@pytest.mark.parametrize("model", ["jobs/job", "jobs/jobmetric", "jobs/jobevent", "billing/usageentry"])
def test_admin_lists_jobs_and_usage_read_only(tenant, client, model):
    job = make_job(tenant)
    ingest(job, state_event(1, "running"), metrics_event(2, 1), usage_event(3, job=job))
    client.force_login(UserFactory(username="staff", is_staff=True, is_superuser=True))
    assert client.get(f"/admin/{model}/").status_code == 200
    assert client.get(f"/admin/{model}/add/").status_code == 403


def test_the_job_list_has_the_latest_reward_the_latest_evaluation_and_the_cost(tenant, api_client):
    from billing.models import JobUsageTotals

    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name="scored")
    services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name="bare")
    for step, data in ((1, {"reward_mean": 0.2, "eval_accuracy": 0.1}), (2, {"reward_mean": 0.4}),
                       (3, {"reward_mean": 0.5, "loss": 0.1})):
        JobMetric.objects.create(job=job, step=step, seq=step, data={"step": step, **data})
    JobUsageTotals.objects.create(job=job, rows=3, device_seconds=5400.0)
    api_client.force_authenticate(tenant.viewer)
    rows = {r["name"]: r for r in api_client.get(JOBS).json()["results"]}
    assert (rows["scored"]["latest_reward"], rows["scored"]["eval_accuracy"], rows["scored"]["device_hours"]) == (
        0.5, 0.1, 1.5)
    assert (rows["bare"]["latest_reward"], rows["bare"]["eval_accuracy"], rows["bare"]["device_hours"]) == (
        None, None, None)
    detail = api_client.get(f"{JOBS}{job.pk}/").json()
    assert (detail["latest_reward"], detail["eval_accuracy"], detail["device_hours"]) == (0.5, 0.1, 1.5)


def test_the_job_list_sorts_on_the_server_across_pages(tenant, api_client):
    from billing.models import JobUsageTotals

    rewards = {"a": 0.3, "b": None, "c": 0.9, "d": 0.1, "e": 0.5}  # "b": no metrics yet
    for name, reward in rewards.items():
        job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name=name)
        if reward is not None:
            JobMetric.objects.create(job=job, step=1, seq=1, data={"step": 1, "reward_mean": reward})
            JobUsageTotals.objects.create(job=job, rows=1, device_seconds=3600.0 * reward)
    api_client.force_authenticate(tenant.viewer)

    def names(ordering: str) -> list[str]:
        out, page = [], f"{JOBS}?ordering={ordering}&page_size=2"
        while page:  # two a page: the order holds across pages, not within each
            body = api_client.get(page).json()
            out += [r["name"] for r in body["results"]]
            page = body["next"]
        return out

    assert names("-latest_reward") == ["c", "e", "a", "d", "b"]  # the job without a reward last
    assert names("latest_reward") == ["d", "a", "e", "c", "b"]  # last either way
    assert names("-device_hours") == ["c", "e", "a", "d", "b"]
    assert names("name") == ["a", "b", "c", "d", "e"]
    assert names("") == ["e", "d", "c", "b", "a"]  # the default: newest first
    refused = api_client.get(f"{JOBS}?ordering=spec")
    assert refused.status_code == 400
    assert "ordering" in refused.json()
