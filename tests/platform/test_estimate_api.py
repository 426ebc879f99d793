"""Pre-run estimates through the API: ``POST jobs/estimate/`` (validated as job create is, writes
nothing), the estimate stored on a created job and shown by its detail, and billing's savings rows
with the estimate beside what was billed. The figures go through billing's own savings function.
"""

import pytest

from engine.accounting.estimate import estimate, write_profile
from engine.accounting.metering import UsageRecord, record_rows, savings_of_rows
from engine.spec import JobSpec
from jobs.models import Job
from tests.platform.builders import JOBS, SPEC, ingest, make_dataset, usage_event

pytestmark = pytest.mark.django_db

ESTIMATE = f"{JOBS}estimate/"
FIGURES = {"dedicated_device_hours", "multiplexed_device_hours", "savings", "step_seconds", "basis"}


@pytest.fixture(autouse=True)
def home(settings, tmp_path):
    """No profiles but the ones a test writes: the estimate's basis is the cost model."""
    settings.PLEXRL_HOME = tmp_path
    return tmp_path


def test_an_estimate_answers_both_figures_from_the_cost_model(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    response = client.post(ESTIMATE, {"spec": SPEC, "rollout_devices": 2, "train_devices": 2}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert set(body) == FIGURES
    assert body["basis"] == "model"
    assert 0 < body["multiplexed_device_hours"] < body["dedicated_device_hours"]
    assert body["savings"] == pytest.approx(1 - body["multiplexed_device_hours"] / body["dedicated_device_hours"])
    assert body["step_seconds"] > 0
    assert not Job.objects.exists()  # an estimate creates nothing


def test_the_figures_are_billings_own_savings_of_the_predicted_calls(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    body = client.post(ESTIMATE, {"spec": SPEC, "deployment_mode": "isolated_split"}, format="json").json()
    predicted = estimate(JobSpec.from_dict(SPEC))
    same = savings_of_rows(record_rows(predicted.usage_records()), 2, "isolated_split")
    assert body["multiplexed_device_hours"] == pytest.approx(same["billed_device_hours"])
    assert body["dedicated_device_hours"] == pytest.approx(same["counterfactual_device_hours"])
    assert body["multiplexed_device_hours"] == pytest.approx(predicted.held_seconds * 1.0 / 3600 + sum(
        c.seconds for c in predicted.calls if len(c.wpgs) == 2) / 3600)  # a sync holds both groups


def test_a_bigger_reservation_or_more_steps_cost_more(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)

    def figures(**payload):
        return client.post(ESTIMATE, {"spec": SPEC, **payload}, format="json").json()

    base = figures()
    assert figures(rollout_devices=4)["dedicated_device_hours"] > base["dedicated_device_hours"]
    assert figures(rollout_devices=4)["multiplexed_device_hours"] == pytest.approx(base["multiplexed_device_hours"])
    longer = client.post(ESTIMATE, {"spec": {**SPEC, "steps": 30}}, format="json").json()
    assert longer["multiplexed_device_hours"] > base["multiplexed_device_hours"]


def test_a_profile_of_the_same_shape_becomes_the_basis(tenant, token_client, home):
    spec = JobSpec.from_dict(SPEC)
    predicted = estimate(spec, home=home)
    # a finished job of this shape that took twice what the model said, every call
    usage = [UsageRecord(**{**r.to_dict(), "end": r.start + 2 * r.seconds}).to_dict()
             for r in predicted.usage_records()]
    write_profile(spec, usage, home=home)
    client = token_client(tenant.member, tenant.organization)
    body = client.post(ESTIMATE, {"spec": {**SPEC, "seed": 9}}, format="json").json()  # the seed is no shape
    assert body["basis"] == "profile"
    model = client.post(ESTIMATE, {"spec": {**SPEC, "grpo": {"updates_per_step": 2}}}, format="json").json()
    assert model["basis"] == "model"  # another shape


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({"name": "no spec"}, {"spec"}),
        ({"spec": "arith"}, {"spec"}),
        ({"spec": {"task": "arith", "steps": 0}}, {"spec.steps"}),
        ({"spec": {"task": "chess"}}, {"spec.task"}),
        ({"spec": {"task": "arith", "grpo": {"lr": -1.0}}}, {"spec.grpo.lr"}),
        ({"spec": {"task": "arith", "model": "no-such-model"}}, {"spec.model"}),
        ({"spec": {"task": "dataset", "model": "tiny-arith", "dataset": 999}}, {"spec.dataset"}),
        ({"spec": SPEC, "rollout_devices": 0}, {"rollout_devices"}),
        ({"spec": SPEC, "deployment_mode": "shared"}, {"deployment_mode"}),
        ({"spec": SPEC, "priority": 5}, {"priority"}),
    ],
    ids=["missing-spec", "spec-string", "steps-0", "unknown-task", "bad-lr", "unknown-model", "unknown-dataset",
         "devices-0", "unknown-mode", "extra-field"],
)  # fmt: skip
def test_bad_input_answers_400_field_by_field(tenant, token_client, payload, fields):
    response = token_client(tenant.member, tenant.organization).post(ESTIMATE, payload, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields


def test_another_organizations_dataset_cannot_be_estimated(tenant, other_tenant, token_client):
    theirs = make_dataset(other_tenant, user=other_tenant.owner, name="theirs")
    mine = make_dataset(tenant, name="mine")
    ok = token_client(tenant.member, tenant.organization).post(
        ESTIMATE, {"spec": {"task": "dataset", "model": "tiny-arith", "dataset": mine.pk}}, format="json")
    assert ok.status_code == 200, ok.json()
    spec = {"task": "dataset", "model": "tiny-arith", "dataset": theirs.pk}
    response = token_client(tenant.member, tenant.organization).post(ESTIMATE, {"spec": spec}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"spec.dataset"}


def test_viewers_and_anonymous_requests_cannot_estimate(tenant, token_client, api_client):
    assert token_client(tenant.viewer, tenant.organization).post(ESTIMATE, {"spec": SPEC},
                                                                 format="json").status_code == 403
    assert api_client.post(ESTIMATE, {"spec": SPEC}, format="json").status_code == 401


def test_a_created_job_stores_its_estimate_and_shows_it(tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    expected = client.post(ESTIMATE, {"spec": SPEC, "train_devices": 3}, format="json").json()
    created = client.post(JOBS, {"spec": SPEC, "train_devices": 3}, format="json")
    assert created.status_code == 201, created.json()
    job = Job.objects.get()
    assert job.estimate == pytest.approx(expected)
    assert created.json()["estimate"] == pytest.approx(expected)
    assert client.get(f"{JOBS}{job.pk}/").json()["estimate"] == pytest.approx(expected)


def test_a_refused_job_stores_no_estimate(tenant, token_client):
    response = token_client(tenant.member, tenant.organization).post(JOBS, {"spec": {"task": "chess"}}, format="json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_savings_rows_show_the_estimate_beside_the_bill(tenant, other_tenant, token_client):
    client = token_client(tenant.member, tenant.organization)
    job = Job.objects.get(pk=client.post(JOBS, {"spec": SPEC, "name": "mine"}, format="json").json()["id"])
    ingest(job, usage_event(1, job=job, start=10.0, end=46.0))
    older = Job.objects.create(organization=tenant.organization, spec=JobSpec().to_dict(), name="older")
    theirs = token_client(other_tenant.owner, other_tenant.organization).post(JOBS, {"spec": SPEC}, format="json")
    report = client.get("/api/v1/billing/savings/").json()
    rows = {row["name"]: row for row in report["jobs"]}
    assert set(rows) == {"mine", "older"}  # never another organization's
    assert theirs.json()["id"] not in {row["job"] for row in report["jobs"]}
    assert rows["mine"]["estimated_device_hours"] == pytest.approx(job.estimate["multiplexed_device_hours"])
    assert rows["mine"]["billed_device_hours"] == pytest.approx(36 / 3600)
    assert rows["older"]["estimated_device_hours"] is None
    assert older.estimate is None
    csv = client.get("/api/v1/billing/savings/?format=csv").content.decode()
    assert csv.splitlines()[0].startswith("job,name,state,estimated_device_hours,billed_device_hours")
