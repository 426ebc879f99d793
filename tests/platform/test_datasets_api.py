"""Datasets with two tenants: upload (JSONL, CSV or Parquet, validated line by line or row by row by
the engine's loader), list, detail,
delete, and jobs on a dataset (the id resolved to the stored file within the organization).

Every test stores files in a temporary PLEXRL_HOME; an upload that fails leaves no row and no file.
"""

import json
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from accounts.models import AuditLog
from jobs import datasets, services
from jobs.models import Dataset, Job, JobState
from tests.datafiles import csv_bytes, parquet_bytes
from tests.platform.builders import JOBS, ROWS, jsonl, make_dataset
from tests.platform.tenants import give_plan

pytestmark = pytest.mark.django_db

DATASETS = "/api/v1/datasets/"


@pytest.fixture(autouse=True)
def home(settings, tmp_path) -> Path:
    """A temporary PLEXRL_HOME for the dataset files."""
    settings.PLEXRL_HOME = tmp_path / "home"
    return settings.PLEXRL_HOME


def upload(client, name="sums", content=None, filename="sums.jsonl", **extra):
    data = {"name": name, "file": SimpleUploadedFile(filename, jsonl() if content is None else content)}
    data.update(extra)
    return client.post(DATASETS, data, format="multipart")


def stored_files(home: Path) -> list[Path]:
    return sorted(p for p in (home / "datasets").rglob("*") if p.is_file()) if (home / "datasets").exists() else []


# --- upload ---------------------------------------------------------------------------------------


def test_upload_stores_the_file_and_the_row(tenant, token_client, home):
    response = upload(token_client(tenant.member, tenant.organization))
    assert response.status_code == 201, response.json()
    body = response.json()
    dataset = Dataset.objects.get()
    assert body == {
        "id": dataset.pk, "name": "sums", "problems": 12, "eval_problems": None, "size_bytes": len(jsonl()),
        "created_by": "acme-member", "created_at": body["created_at"],
    }  # fmt: skip
    path = Path(dataset.path)
    assert path.parent == home / "datasets" / str(tenant.organization.pk)
    assert path.suffix == ".jsonl"
    assert path.read_bytes() == jsonl()
    assert stored_files(home) == [path]  # no temporary file left
    row = AuditLog.objects.get(action="dataset.created")
    assert (row.organization, row.actor, row.target) == (tenant.organization, tenant.member, f"dataset-{dataset.pk}")


def test_an_evaluation_file_is_stored_beside_and_jobs_evaluate_on_it(tenant, token_client, home,
                                                                     django_capture_on_commit_callbacks):
    client = token_client(tenant.member, tenant.organization)
    evaluation = [{"q": "What is 100 + 1?", "a": 101}, {"q": "What is 7 + 7?", "a": 14}]
    response = upload(client, content=csv_bytes([{"q": r["prompt"], "a": r["answer"]} for r in ROWS]),
                      filename="train.csv", prompt_column="q", answer_column="a",
                      eval_file=SimpleUploadedFile("eval.csv", csv_bytes(evaluation)))
    assert response.status_code == 201, response.json()
    assert (response.json()["problems"], response.json()["eval_problems"]) == (12, 2)
    dataset = Dataset.objects.get()
    assert Path(dataset.eval_path).read_bytes() == jsonl([{"prompt": r["q"], "answer": str(r["a"])}
                                                          for r in evaluation])
    assert stored_files(home) == sorted([Path(dataset.path), Path(dataset.eval_path)])
    job = client.post(JOBS, {"spec": {"task": "dataset", "dataset": dataset.pk, "model": "tiny-arith"}},
                      format="json")
    assert job.status_code == 201, job.json()
    assert (job.json()["spec"]["dataset"], job.json()["spec"]["eval_dataset"]) == (dataset.path, dataset.eval_path)
    Job.objects.update(state=JobState.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"{DATASETS}{dataset.pk}/").status_code == 204
    assert stored_files(home) == []  # both files


@pytest.mark.parametrize(("eval_content", "message"), [
    (b'{"prompt": "1+1"}\n', "line 1:"),
    (jsonl() * 20, "the limit is"),  # the dataset's limit is both files together
])
def test_a_bad_evaluation_file_answers_400_and_stores_nothing(tenant, token_client, home, eval_content, message):
    give_plan(tenant.organization, max_dataset_bytes=len(jsonl()) * 10)
    response = upload(token_client(tenant.member, tenant.organization),
                      eval_file=SimpleUploadedFile("eval.jsonl", eval_content))
    assert response.status_code == 400
    assert message in response.json()["eval_file"][0], response.json()
    assert not Dataset.objects.exists()
    assert stored_files(home) == []


def test_a_spec_cannot_name_an_evaluation_file(tenant, token_client):
    dataset = make_dataset(tenant)
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "dataset", "dataset": dataset.pk, "model": "tiny-arith", "eval_dataset": "/etc/x"}},
        format="json")
    assert response.status_code == 400
    assert "spec.eval_dataset" in response.json()
    assert not Job.objects.exists()


def test_a_viewer_cannot_upload(tenant, token_client, home):
    response = upload(token_client(tenant.viewer, tenant.organization))
    assert response.status_code == 403
    assert not Dataset.objects.exists()
    assert stored_files(home) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (jsonl(ROWS[:3]) + b"{not json}\n" + jsonl(ROWS[3:]), "line 4: not JSON"),
        (jsonl(ROWS[:6]) + b'{"prompt": "x"}\n', 'line 7: "answer" must be a non-empty string'),
        (jsonl(ROWS[:2]) + b'{"prompt": "p", "answer": "a", "hint": 1}\n', "line 3: unknown field 'hint'"),
        (jsonl(ROWS[:2] + ROWS[:1]), "line 3: the prompt appears twice"),
        (b"\xff\xfe\n", "line 1: not UTF-8 text"),
        (b"\n\n", "no problems"),
    ],
    ids=["json", "missing-answer", "extra-field", "duplicate", "utf8", "blank"],
)
def test_a_bad_file_answers_400_naming_the_line_and_creates_nothing(tenant, token_client, home, content, message):
    response = upload(token_client(tenant.member, tenant.organization), content=content)
    assert response.status_code == 400
    assert message in response.json()["file"][0]
    assert not Dataset.objects.exists()
    assert not AuditLog.objects.filter(action="dataset.created").exists()
    assert stored_files(home) == []


def table(rows=ROWS) -> list[dict]:
    """The rows as a table would hold them: other column names, and a column more."""
    return [{"n": i, "question": row["prompt"], "solution": row["answer"]} for i, row in enumerate(rows)]


MAPPED = {"prompt_column": "question", "answer_column": "solution"}


@pytest.mark.parametrize(("filename", "content", "extra"), [
    ("sums.csv", csv_bytes(table()), MAPPED),
    ("sums.parquet", parquet_bytes(table()), MAPPED),
    ("export.txt", csv_bytes(table()), {**MAPPED, "format": "csv"}),  # the format named, not guessed
    ("sums.jsonl", jsonl([{"q": r["prompt"], "a": r["answer"]} for r in ROWS]), {"prompt_column": "q",
                                                                                 "answer_column": "a"}),
], ids=["csv", "parquet", "named-format", "mapped-jsonl"])
def test_a_csv_or_parquet_file_with_mapped_columns_is_stored_as_the_same_problems_in_jsonl(
        tenant, token_client, home, filename, content, extra):
    response = upload(token_client(tenant.member, tenant.organization), content=content, filename=filename, **extra)
    assert response.status_code == 201, response.json()
    dataset = Dataset.objects.get()
    # what a job reads: byte for byte the JSONL upload of the same problems
    assert Path(dataset.path).read_bytes() == jsonl()
    assert (dataset.problems, response.json()["size_bytes"]) == (12, len(jsonl()))
    assert stored_files(home) == [Path(dataset.path)]
    audit = AuditLog.objects.get(action="dataset.created").data
    assert (audit["format"], audit["columns"]) == (extra.get("format", Path(filename).suffix[1:]),
                                                  [extra["prompt_column"], extra["answer_column"]])


@pytest.mark.parametrize(("filename", "content", "extra", "field", "message"), [
    ("sums.csv", csv_bytes(table()), {}, "file", "no column 'prompt'; the file's columns: 'n', 'question', 'solution'"),
    ("sums.csv", csv_bytes(table()[:3]) + b"3,What is 3 + 3?\n", MAPPED, "file",
     'line 5: 2 fields; the header has 3'),
    ("sums.csv", csv_bytes([*table()[:2], {"n": 2, "question": "x", "solution": ""}]), MAPPED, "file",
     'line 4: "solution" must be a non-empty string'),
    ("sums.parquet", parquet_bytes([*table()[:2], {"n": 2, "question": "x", "solution": None}]), MAPPED, "file",
     'row 3: "solution" must be a non-empty string'),
    ("sums.parquet", csv_bytes(table()), MAPPED, "file", "not a Parquet file"),
    ("sums.csv", csv_bytes(table()), {**MAPPED, "format": "xlsx"}, "format", "is not a valid choice"),
], ids=["unmapped", "short-record", "empty-answer", "null-answer", "not-parquet", "unknown-format"])
def test_a_bad_table_answers_400_naming_the_line_or_row_and_creates_nothing(
        tenant, token_client, home, filename, content, extra, field, message):
    response = upload(token_client(tenant.member, tenant.organization), content=content, filename=filename, **extra)
    assert response.status_code == 400
    assert message in response.json()[field][0]
    assert not Dataset.objects.exists()
    assert not AuditLog.objects.filter(action="dataset.created").exists()
    assert stored_files(home) == []


def test_an_empty_file_is_refused(tenant, token_client, home):
    response = upload(token_client(tenant.member, tenant.organization), content=b"")
    assert response.status_code == 400
    assert "file" in response.json()
    assert stored_files(home) == []


@pytest.mark.parametrize(
    ("data", "field"),
    [({"name": "sums"}, "file"), ({}, "name"), ({"name": "  "}, "name")],
    ids=["no-file", "no-name", "blank-name"],
)
def test_missing_fields_answer_400(tenant, token_client, home, data, field):
    if data.get("name") != "sums":
        data = {**data, "file": SimpleUploadedFile("d.jsonl", jsonl())}
    response = token_client(tenant.member, tenant.organization).post(DATASETS, data, format="multipart")
    assert response.status_code == 400
    assert field in response.json()
    assert not Dataset.objects.exists()
    assert stored_files(home) == []


def test_an_unknown_field_answers_400(tenant, token_client, home):
    response = upload(token_client(tenant.member, tenant.organization), description="x")
    assert response.status_code == 400
    assert "description" in response.json()
    assert stored_files(home) == []


def test_a_duplicate_name_answers_400_but_another_organization_may_use_it(
    tenant, other_tenant, token_client, home
):
    client = token_client(tenant.member, tenant.organization)
    assert upload(client).status_code == 201
    response = upload(client)
    assert response.status_code == 400
    assert "already exists" in response.json()["name"][0]
    assert Dataset.objects.count() == 1
    assert len(stored_files(home)) == 1
    assert upload(token_client(other_tenant.member, other_tenant.organization)).status_code == 201


def test_an_oversize_file_answers_400_and_creates_nothing(tenant, token_client, home):
    give_plan(tenant.organization, max_dataset_bytes=100)
    response = upload(token_client(tenant.member, tenant.organization))
    assert response.status_code == 400
    assert response.json()["file"] == [f"the file is {len(jsonl())} bytes; the limit is 100 bytes"]
    assert not Dataset.objects.exists()
    assert stored_files(home) == []


def test_an_oversize_request_is_refused_before_its_body_is_read(tenant, token_client, home, monkeypatch):
    give_plan(tenant.organization, max_dataset_bytes=100)
    monkeypatch.setattr("jobs.resource_views.MULTIPART_SLACK", 10)
    client = token_client(tenant.member, tenant.organization)
    monkeypatch.setattr(
        "rest_framework.request.Request.data", property(lambda self: pytest.fail("the body was parsed"))
    )
    response = upload(client)
    assert response.status_code == 400
    assert "the limit is 100 bytes" in response.json()["file"][0]
    assert stored_files(home) == []


def test_the_service_checks_the_size_before_reading(tenant, home):
    class Huge(SimpleUploadedFile):
        def chunks(self, chunk_size=None):
            raise AssertionError("read")

    big = Huge("d.jsonl", b"x")
    big.size = datasets.MAX_BYTES + 1
    with pytest.raises(ValidationError, match="the limit is"):
        datasets.dataset_create(organization=tenant.organization, user=tenant.member, name="big", upload=big)
    assert stored_files(home) == []


def test_a_file_longer_than_it_claims_is_stopped_at_the_limit(tenant, home):
    give_plan(tenant.organization, max_dataset_bytes=100)
    lying = SimpleUploadedFile("d.jsonl", jsonl())
    lying.size = 10
    with pytest.raises(ValidationError, match="the limit is 100 bytes"):
        datasets.dataset_create(organization=tenant.organization, user=tenant.member, name="x", upload=lying)
    assert stored_files(home) == []


def test_a_database_error_removes_the_written_file(tenant, home, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("audit down")

    monkeypatch.setattr(datasets, "audit_record", broken)
    with pytest.raises(RuntimeError):
        make_dataset(tenant)
    assert not Dataset.objects.exists()
    assert stored_files(home) == []


# --- list, detail, two tenants --------------------------------------------------------------------


def test_list_and_detail_show_only_the_organizations_datasets(tenant, other_tenant, token_client):
    mine = make_dataset(tenant, name="mine")
    theirs = make_dataset(other_tenant, name="theirs")
    client = token_client(tenant.viewer, tenant.organization)
    listing = client.get(DATASETS)
    assert listing.status_code == 200
    assert [d["id"] for d in listing.json()["results"]] == [mine.pk]
    assert client.get(f"{DATASETS}{mine.pk}/").json()["name"] == "mine"
    assert client.get(f"{DATASETS}{theirs.pk}/").status_code == 404
    assert "path" not in listing.json()["results"][0]


def test_another_organizations_dataset_cannot_be_deleted(tenant, other_tenant, token_client):
    theirs = make_dataset(other_tenant)
    response = token_client(tenant.owner, tenant.organization).delete(f"{DATASETS}{theirs.pk}/")
    assert response.status_code == 404
    assert Dataset.objects.filter(pk=theirs.pk).exists()


# --- delete ---------------------------------------------------------------------------------------


def test_a_member_deletes_their_dataset_and_the_file_goes_on_commit(
    tenant, token_client, home, django_capture_on_commit_callbacks
):
    dataset = make_dataset(tenant)
    path = Path(dataset.path)
    with django_capture_on_commit_callbacks(execute=True):
        response = token_client(tenant.member, tenant.organization).delete(f"{DATASETS}{dataset.pk}/")
    assert response.status_code == 204
    assert not Dataset.objects.exists()
    assert not path.exists()
    row = AuditLog.objects.get(action="dataset.deleted")
    assert (row.actor, row.target, row.data) == (tenant.member, f"dataset-{dataset.pk}", {"name": "sums"})


def test_the_file_stays_until_the_transaction_commits(tenant, home):
    dataset = make_dataset(tenant)
    datasets.dataset_delete(dataset=dataset, actor=tenant.member)  # the test's transaction never commits
    assert Path(dataset.path).exists()


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("member", 403), ("admin", 204), ("owner", 204)])
def test_deleting_someone_elses_dataset_needs_an_admin(tenant, token_client, role, status):
    dataset = make_dataset(tenant, user=tenant.owner if role == "member" else tenant.member)
    response = token_client(tenant.user(role), tenant.organization).delete(f"{DATASETS}{dataset.pk}/")
    assert response.status_code == status
    assert Dataset.objects.filter(pk=dataset.pk).exists() == (status != 204)


def test_a_dataset_an_active_job_reads_cannot_be_deleted(tenant, token_client):
    dataset = make_dataset(tenant)
    job = services.job_create(organization=tenant.organization, user=tenant.member,
                              spec={"task": "dataset", "dataset": dataset.pk, "model": "tiny-arith"})
    client = token_client(tenant.member, tenant.organization)
    response = client.delete(f"{DATASETS}{dataset.pk}/")
    assert response.status_code == 409
    assert f"ids {job.pk}" in response.json()["detail"]
    assert Dataset.objects.filter(pk=dataset.pk).exists()
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    assert client.delete(f"{DATASETS}{dataset.pk}/").status_code == 204


# --- jobs on datasets -----------------------------------------------------------------------------


def test_a_job_on_a_dataset_stores_the_files_path(tenant, token_client):
    dataset = make_dataset(tenant)
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "dataset", "dataset": dataset.pk, "model": "tiny-arith", "steps": 2}}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["dataset"] == dataset.path
    assert Job.objects.get().spec["dataset"] == dataset.path


@pytest.mark.parametrize("which", ["other-org", "unknown", "path", "string-id", "bool"])
def test_a_job_cannot_name_a_dataset_outside_its_organization(tenant, other_tenant, token_client, which):
    theirs = make_dataset(other_tenant)
    value = {"other-org": theirs.pk, "unknown": theirs.pk + 1000, "path": theirs.path, "string-id": str(theirs.pk),
             "bool": True}[which]
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "dataset", "dataset": value, "model": "tiny-arith"}}, format="json"
    )
    assert response.status_code == 400
    assert "spec.dataset" in response.json()
    assert theirs.path not in json.dumps(response.json())
    assert not Job.objects.exists()


def test_a_dataset_job_without_a_dataset_is_the_engines_error(tenant, token_client):
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "dataset", "model": "tiny-arith"}}, format="json"
    )
    assert response.status_code == 400
    assert "JSONL" in response.json()["spec.dataset"][0]
