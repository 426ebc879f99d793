"""The billing REST API with two tenants: the usage ledger and the savings report (JSON and CSV).

Usage rows arrive through ``jobs.ingest.ingest_events`` as the engine's ``usage`` events; each
tenant sees only its own rows and jobs. Viewers can read both.
"""

import csv
import io

import pytest

from jobs import ingest, services
from jobs.models import Job, JobState

pytestmark = pytest.mark.django_db

USAGE = "/api/v1/billing/usage/"
SAVINGS = "/api/v1/billing/savings/"


def make_job(tenant, *, name="run", rollout_devices=1, train_devices=1) -> Job:
    return services.job_create(organization=tenant.organization, user=tenant.member, spec={"task": "arith", "steps": 3},
                               name=name, rollout_devices=rollout_devices, train_devices=train_devices)  # fmt: skip


def usage_event(seq, *, job, call, start, end, devices=1.0, role="policy", fn="generate", queued_s=0.0, setup_s=0.0):
    data = {
        "job": job.engine_id,
        "role": role,
        "fn": fn,
        "wpg": "w0",
        "devices": devices,
        "start": start,
        "end": end,
        "setup_s": setup_s,
        "exec_s": end - start - setup_s,
        "call": call,
        "tenant": "",
        "queued_s": queued_s,
    }
    return {"seq": seq, "kind": "usage", "ts": end, "data": data}


def run(job, *usage):
    """The job's log: it ran, made these calls, and succeeded."""
    events = [{"seq": 1, "kind": "state", "ts": 1.0, "data": {"state": "running"}}]
    events += [usage_event(i + 2, job=job, **u) for i, u in enumerate(usage)]
    events.append({"seq": len(events) + 1, "kind": "state", "ts": 100.0, "data": {"state": "succeeded"}})
    ingest.ingest_events(job=job, events=events)
    job.refresh_from_db()
    return job


@pytest.fixture
def ledger(tenant, other_tenant):
    """acme: two jobs that ran, one that did not; globex: one job that ran."""
    a = run(
        make_job(tenant, name="a"), {"call": 1, "start": 10.0, "end": 20.0}, {"call": 2, "start": 20.0, "end": 30.0}
    )
    b = run(make_job(tenant, name="b", rollout_devices=2, train_devices=2),
            {"call": 1, "start": 0.0, "end": 3600.0, "devices": 2.0})  # fmt: skip
    idle = make_job(tenant, name="idle")
    theirs = run(make_job(other_tenant, name="theirs"), {"call": 1, "start": 5.0, "end": 6.0})
    return {"a": a, "b": b, "idle": idle, "theirs": theirs}


# --- usage --------------------------------------------------------------------------------------


def test_usage_lists_this_organizations_entries(tenant, token_client, ledger):
    response = token_client(tenant.viewer, tenant.organization).get(USAGE)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 3
    assert {row["job"] for row in body["results"]} == {ledger["a"].pk, ledger["b"].pk}
    row = next(r for r in body["results"] if r["job"] == ledger["b"].pk)
    assert set(row) == {
        "id", "job", "seq", "call", "role", "fn", "wpg", "devices", "start", "end", "setup_s", "exec_s", "queued_s",
        "device_seconds", "redone",
    }  # fmt: skip
    assert (row["seq"], row["role"], row["fn"], row["devices"], row["device_seconds"]) == (
        2, "policy", "generate", 2.0, 7200.0)  # fmt: skip


def test_usage_filters_by_job(tenant, token_client, ledger):
    client = token_client(tenant.viewer, tenant.organization)
    rows = client.get(USAGE, {"job": ledger["a"].pk}).json()["results"]
    assert [(r["job"], r["seq"]) for r in rows] == [(ledger["a"].pk, 2), (ledger["a"].pk, 3)]
    assert client.get(USAGE, {"job": ledger["idle"].pk}).json()["count"] == 0
    # another organization's job: nothing, not its rows
    assert client.get(USAGE, {"job": ledger["theirs"].pk}).json()["count"] == 0


@pytest.mark.parametrize("job", ["abc", "0", "-1"])
def test_usage_rejects_a_bad_job_filter(tenant, token_client, job):
    response = token_client(tenant.viewer, tenant.organization).get(USAGE, {"job": job})
    assert response.status_code == 400
    assert set(response.json()) == {"job"}


def test_usage_needs_authentication(api_client, ledger):
    assert api_client.get(USAGE).status_code == 401


def test_usage_replayed_events_are_not_counted_twice(tenant, token_client, ledger):
    job = ledger["a"]
    assert ingest.ingest_events(job=job, events=[usage_event(2, job=job, call=1, start=10.0, end=20.0)]) == 0
    assert token_client(tenant.viewer, tenant.organization).get(USAGE).json()["count"] == 3


# --- savings ------------------------------------------------------------------------------------


def test_savings_per_job_and_totals(tenant, token_client, ledger):
    response = token_client(tenant.viewer, tenant.organization).get(SAVINGS)
    assert response.status_code == 200
    body = response.json()
    rows = {row["job"]: row for row in body["jobs"]}
    assert set(rows) == {ledger["a"].pk, ledger["b"].pk, ledger["idle"].pk}
    assert [row["job"] for row in body["jobs"]] == [ledger["idle"].pk, ledger["b"].pk, ledger["a"].pk]  # newest first
    a, b, idle = rows[ledger["a"].pk], rows[ledger["b"].pk], rows[ledger["idle"].pk]
    assert set(a) == {"job", "name", "state", "estimated_device_hours", "billed_device_hours",
                      "counterfactual_device_hours", "savings", "redone_device_hours"}
    assert (a["name"], a["state"]) == ("a", "succeeded")
    assert a["estimated_device_hours"] == pytest.approx(ledger["a"].estimate["multiplexed_device_hours"])
    # a: 20 device-seconds billed; alone it would hold 2 devices for its 20 s span
    assert a["billed_device_hours"] == pytest.approx(20 / 3600)
    assert a["counterfactual_device_hours"] == pytest.approx(40 / 3600)
    assert a["savings"] == pytest.approx(0.5)
    # b: 2 devices for an hour billed; 4 reserved for that hour
    assert (b["billed_device_hours"], b["counterfactual_device_hours"]) == (pytest.approx(2.0), pytest.approx(4.0))
    assert b["savings"] == pytest.approx(0.5)
    assert (idle["state"], idle["billed_device_hours"], idle["savings"]) == ("queued", 0.0, None)
    totals = body["totals"]
    assert totals["jobs"] == 3
    assert totals["billed_device_hours"] == pytest.approx(2 + 20 / 3600)
    assert totals["counterfactual_device_hours"] == pytest.approx(4 + 40 / 3600)
    assert totals["savings"] == pytest.approx(0.5)
    assert "theirs" not in response.content.decode()


def test_savings_match_the_job_detail(tenant, token_client, ledger):
    client = token_client(tenant.viewer, tenant.organization)
    row = next(r for r in client.get(SAVINGS).json()["jobs"] if r["job"] == ledger["a"].pk)
    detail = client.get(f"/api/v1/jobs/{ledger['a'].pk}/").json()["savings"]
    assert row["billed_device_hours"] == pytest.approx(detail["billed_device_hours"])
    assert row["counterfactual_device_hours"] == pytest.approx(detail["counterfactual_device_hours"])
    assert row["savings"] == pytest.approx(detail["savings"])


def test_savings_subtract_what_sharing_added(tenant, token_client):
    # A call that queued 5 s for its group and spent 1 s switching in: the dedicated counterfactual
    # is the span less both.
    job = run(make_job(tenant), {"call": 1, "start": 10.0, "end": 20.0, "queued_s": 5.0, "setup_s": 1.0})
    row = token_client(tenant.viewer, tenant.organization).get(SAVINGS).json()["jobs"][0]
    assert row["job"] == job.pk
    assert row["counterfactual_device_hours"] == pytest.approx(2 * (15 - 6) / 3600)


def test_savings_of_an_organization_without_jobs(tenant, token_client, other_tenant):
    run(make_job(other_tenant), {"call": 1, "start": 0.0, "end": 10.0})
    body = token_client(tenant.viewer, tenant.organization).get(SAVINGS).json()
    assert body == {
        "jobs": [],
        "totals": {"jobs": 0, "billed_device_hours": 0.0, "counterfactual_device_hours": 0.0, "savings": None,
                   "redone_device_hours": 0.0},
    }


def read_csv(response) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))


HEADER = ["job", "name", "state", "estimated_device_hours", "billed_device_hours", "counterfactual_device_hours",
          "savings", "redone_device_hours"]


def test_savings_as_csv(tenant, token_client, ledger):
    client = token_client(tenant.viewer, tenant.organization)
    rows = read_csv(client.get(SAVINGS, {"format": "csv"}))
    assert rows[0] == HEADER
    assert len(rows) == 1 + 3  # one row per job of the organization
    by_job = {int(row[0]): dict(zip(HEADER, row, strict=True)) for row in rows[1:]}
    assert set(by_job) == {ledger["a"].pk, ledger["b"].pk, ledger["idle"].pk}
    a = by_job[ledger["a"].pk]
    assert (a["name"], a["state"]) == ("a", "succeeded")
    assert float(a["savings"]) == pytest.approx(0.5)
    assert by_job[ledger["idle"].pk]["savings"] == ""  # null: nothing ran
    # Content negotiation asks for the same.
    assert read_csv(client.get(SAVINGS, HTTP_ACCEPT="text/csv")) == rows


def test_savings_csv_quotes_names(tenant, token_client):
    make_job(tenant, name='lr=3e-4, "warm"\nstart')
    rows = read_csv(token_client(tenant.viewer, tenant.organization).get(SAVINGS, {"format": "csv"}))
    assert rows[1][1] == 'lr=3e-4, "warm"\nstart'


def test_savings_csv_of_no_jobs_is_a_header(tenant, token_client):
    assert read_csv(token_client(tenant.viewer, tenant.organization).get(SAVINGS, {"format": "csv"})) == [HEADER]


def test_savings_csv_needs_authentication(api_client, ledger):
    response = api_client.get(SAVINGS, {"format": "csv"})
    assert response.status_code == 401
    assert "theirs" not in response.content.decode()


def test_an_unknown_format_answers_404(tenant, token_client):
    assert token_client(tenant.viewer, tenant.organization).get(SAVINGS, {"format": "xlsx"}).status_code == 404


def test_job_states_in_savings_follow_the_jobs(tenant, token_client, ledger):
    services.job_cancel(job=ledger["idle"], actor=tenant.owner)
    rows = token_client(tenant.viewer, tenant.organization).get(SAVINGS).json()["jobs"]
    assert next(r for r in rows if r["job"] == ledger["idle"].pk)["state"] == JobState.CANCELLED
