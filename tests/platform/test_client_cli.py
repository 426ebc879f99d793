"""The REST client (``plexrl_client``) and the ``plexrl`` platform commands against a live
server: daphne on the test database, the CLI in subprocesses. No Celery worker runs, so jobs never
reach the engine; their metrics, usage and state changes are ingested from here, as the worker's
event pull would."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plexrl_client import (
    ApiError,
    BadRequest,
    Conflict,
    NotFound,
    PlexRLError,
    ServiceClient,
    Unauthorized,
    Unreachable,
)
from plexrl_client import client as client_module
from tests.platform import live

SPEC = {"task": "arith", "model": "tiny-arith", "steps": 5, "seed": 1, "rollout": "torch", "trainer": "torch"}
PASSWORD = "correct horse battery"

pytestmark = pytest.mark.django_db(transaction=True)  # the server is another process: rows are committed


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """daphne on the test database; its base URL. Without REDIS_URL its Celery sends (launch, cancel,
    ...) go to an in-memory broker nobody reads, so no worker anywhere picks them up."""
    home = tmp_path_factory.mktemp("client-cli")
    env = live.platform_env(home)
    del env["REDIS_URL"]
    proc, url = live.asgi_server(env, home)
    yield url
    proc.stop()


class Org:
    """An organization with an owner, who holds an API token (``client`` uses it)."""

    def __init__(self, name: str, url: str):
        from accounts.services import organization_create, token_create
        from tests.platform.factories import UserFactory

        self.owner = UserFactory(username=f"{name}-owner")
        self.organization = organization_create(name=name.capitalize(), owner=self.owner)
        _, self.token = token_create(user=self.owner, organization=self.organization, name="test")
        self.url = url
        self.client = ServiceClient(url, self.token, timeout=10)

    def cli(self, *args: str, token: str | None = None, url: str | None = None, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        """``plexrl ARGS`` in a subprocess, with PLEXRL_URL and PLEXRL_TOKEN set."""
        return subprocess.run(_argv(args), env=self.env(token, url), input=stdin, capture_output=True, text=True,
                              timeout=timeout, cwd=live.REPO)

    def start_cli(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(_argv(args), env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=live.REPO)

    def env(self, token: str | None = None, url: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXRL_")}
        return env | {"PLEXRL_URL": url or self.url, "PLEXRL_TOKEN": self.token if token is None else token,
                      "PYTHONIOENCODING": "utf-8"}


def _argv(args) -> list[str]:
    return [sys.executable, "-m", "plexrl", *args]


@pytest.fixture
def acme(server) -> Org:
    return Org("acme", server)


@pytest.fixture
def globex(server) -> Org:
    return Org("globex", server)


def ingest(job_id: int, *events: dict) -> None:
    """Events of the job's engine log, as the worker's pull would bring them."""
    from jobs import ingest
    from jobs.models import Job

    ingest.ingest_events(job=Job.objects.get(pk=job_id), events=list(events))


def state(seq: int, name: str, **extra) -> dict:
    return {"seq": seq, "kind": "state", "ts": 1000.0 + seq, "data": {"state": name, **extra}}


def metrics(seq: int, step: int, reward: float) -> dict:
    return {"seq": seq, "kind": "metrics", "ts": 1000.0 + seq, "data": {
        "step": step, "reward_mean": reward, "train_accuracy": reward, "loss": 0.01 * step, "kl": 0.001 * step}}


def usage(seq: int, hours: float, *, devices: float = 1.0) -> dict:
    now = time.time()
    return {"seq": seq, "kind": "usage", "ts": now, "data": {
        "job": "job-x", "role": "policy", "fn": "generate", "wpg": "w", "devices": devices,
        "start": now - 3600 * hours, "end": now, "setup_s": 0.0, "call": seq, "queued_s": 0.0}}


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("plexrl: error: "), lines
    return lines[0]


# --- the client -----------------------------------------------------------------------------------


def test_obtain_token_trades_a_password_for_a_working_token(acme):
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()  # the server's hashers, not the fast one this process uses
    acme.owner.password = hasher.encode(PASSWORD, hasher.salt())
    acme.owner.save()

    token = ServiceClient.obtain_token(acme.url, acme.owner.username, PASSWORD)
    assert ServiceClient(acme.url, token).jobs() == []
    with pytest.raises(BadRequest) as err:
        ServiceClient.obtain_token(acme.url, acme.owner.username, "wrong")
    assert err.value.status == 400
    assert str(err.value) == "HTTP 400: Unable to log in with the given username and password."

    login = acme.cli("login", "--username", acme.owner.username, "--password-stdin", token="", stdin=PASSWORD + "\n")
    assert login.returncode == 0, login.stderr
    printed = login.stdout.splitlines()
    assert len(printed) == 1  # the token alone: export PLEXRL_TOKEN=$(plexrl login ...)
    assert ServiceClient(acme.url, printed[0]).jobs() == []


def test_submit_creates_a_job_and_an_invalid_one_nothing(acme):
    from jobs.models import Job

    job = acme.client.submit(SPEC, name="first", rollout_devices=2, train_devices=3, deployment_mode="colocated")
    row = Job.objects.get(pk=job["id"])
    assert (row.organization, row.name, row.state) == (acme.organization, "first", "queued")
    assert (row.rollout_devices, row.train_devices, row.deployment_mode) == (2, 3, "colocated")
    assert row.spec["steps"] == job["spec"]["steps"] == 5

    for spec, field in ((SPEC | {"steps": 0}, "spec.steps"),
                        (SPEC | {"model": "../elsewhere/model"}, "spec.model"),
                        (SPEC | {"task": "poetry"}, "spec.task"),
                        (SPEC | {"stepz": 3}, "spec.stepz"),
                        (SPEC | {"grpo": {"lr": -1}}, "spec.grpo.lr")):
        with pytest.raises(BadRequest) as err:
            acme.client.submit(spec)
        assert err.value.status == 400
        assert field in err.value.errors, err.value.errors
        assert str(err.value).startswith(f"HTTP 400: {field}: "), str(err.value)
        assert "\n" not in str(err.value)
    with pytest.raises(ApiError) as err:
        acme.client.submit(SPEC, rollout_devices=0)
    assert "rollout_devices" in err.value.errors
    assert Job.objects.count() == 1


def test_a_job_continues_another_through_the_client_and_the_cli(acme, globex, tmp_path):
    from jobs import services
    from jobs.models import Job

    parent = services.job_create(organization=acme.organization, user=acme.owner, spec=SPEC, name="parent")
    ingest(parent.pk, {"seq": 1, "kind": "checkpoint", "ts": 1.0,
                       "data": {"step": 2, "tag": "step-2", "path": "/ck/step-2", "state": {}}},
           {"seq": 2, "kind": "artifact", "ts": 2.0,
            "data": {"name": "final", "path": str(tmp_path / "final"), "files": ["config.json"]}})
    spec = {k: v for k, v in SPEC.items() if k != "model"}
    child = acme.client.submit(spec, name="child", continue_from=parent.pk)
    assert child["lineage"]["parent"] == {"id": parent.pk, "name": "parent", "weights": "final"}
    assert Job.objects.get(pk=child["id"]).spec["model"] == str(tmp_path / "final")

    made = acme.cli("jobs", "submit", "--task", "arith", "--steps", "2", "--continue-from", str(parent.pk),
                    "--weights", "checkpoint", "--set", "rollout=torch", "--set", "trainer=torch")
    assert made.returncode == 0, made.stderr
    assert Job.objects.get(pk=int(made.stdout)).spec["init_from"] == "/ck/step-2"
    shown = acme.cli("jobs", "show", str(parent.pk))
    assert f"continued by job {child['id']}, {int(made.stdout)}" in shown.stdout

    refused = globex.cli("jobs", "submit", "--task", "arith", "--continue-from", str(parent.pk))
    assert refused.returncode == 2
    assert one_error_line(refused) == f"plexrl: error: HTTP 400: continue_from: no job {parent.pk} in your organization"


def test_client_lists_shows_and_acts_on_jobs(acme, globex, monkeypatch):
    monkeypatch.setattr(client_module, "PAGE_SIZE", 2)  # three jobs: two pages
    ids = [acme.client.submit(SPEC, name=f"job {i}")["id"] for i in range(3)]
    globex.client.submit(SPEC, name="theirs")

    assert [j["id"] for j in acme.client.jobs()] == ids[::-1]  # newest first, both pages
    assert acme.client.pause(ids[0])["state"] == "paused"
    assert [j["id"] for j in acme.client.jobs(state="paused")] == [ids[0]]
    assert acme.client.resume(ids[0])["state"] == "queued"
    cancelled = acme.client.cancel(ids[1], reason="wrong seed")
    assert (cancelled["state"], cancelled["state_reason"]) == ("cancelled", "wrong seed")
    assert acme.client.job(ids[1])["state"] == "cancelled"
    with pytest.raises(Conflict) as err:
        acme.client.resume(ids[1])
    assert err.value.status == 409
    assert "only a paused job can be resumed" in str(err.value)

    ingest(ids[2], state(1, "running"), metrics(2, 1, 0.25), state(3, "paused"), metrics(4, 2, 0.5))
    assert [m["step"] for m in acme.client.metrics(ids[2])] == [1, 2]
    assert [m["step"] for m in acme.client.metrics(ids[2], after_step=1)] == [2]
    assert [e["seq"] for e in acme.client.events(ids[2])] == [1, 3]
    assert [e["data"]["state"] for e in acme.client.events(ids[2], after_seq=1, kind="state")] == ["paused"]


# --- the CLI --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_submits_lists_shows_and_acts_on_jobs(acme, tmp_path):
    from jobs.models import Job

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC | {"name": "from file", "train_devices": 2, "grpo": {"lr": 0.001}}))
    submit = acme.cli("jobs", "submit", str(spec_file), "--steps", "7", "--set", "grpo.kl_coef=0.05",
                      "--set", "rollout=torch")
    assert submit.returncode == 0, submit.stderr
    job_id = int(submit.stdout)  # the id alone on stdout
    assert f"/jobs/{job_id}/" in submit.stderr
    job = Job.objects.get(pk=job_id)
    assert (job.name, job.train_devices, job.spec["steps"]) == ("from file", 2, 7)
    assert (job.spec["grpo"]["lr"], job.spec["grpo"]["kl_coef"]) == (0.001, 0.05)

    flags = acme.cli("jobs", "submit", "--task", "arith", "--model", "tiny-arith", "--steps", "3", "--name", "flags",
                     "--set", "rollout=torch", "--set", "trainer=torch")
    assert flags.returncode == 0, flags.stderr
    other_id = int(flags.stdout)

    listing = acme.cli("jobs", "list")
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "STATE"]
    assert [r.split()[0] for r in rows] == [str(other_id), str(job_id)]
    assert rows[1].split()[1:4] == ["from", "file", "queued"]

    assert acme.cli("jobs", "pause", str(job_id)).stdout == f"job {job_id} paused\n"
    only_paused = acme.cli("jobs", "list", "--state", "paused")
    assert [r.split()[0] for r in only_paused.stdout.splitlines()[1:]] == [str(job_id)]
    assert acme.cli("jobs", "resume", str(job_id)).stdout == f"job {job_id} queued\n"
    cancel = acme.cli("jobs", "cancel", str(job_id), "--reason", "enough")
    assert cancel.stdout == f"job {job_id} cancelled\n"
    job.refresh_from_db()
    assert (job.state, job.state_reason) == ("cancelled", "enough")

    show = acme.cli("jobs", "show", str(job_id))
    assert show.returncode == 0, show.stderr
    assert "state        cancelled (enough)\n" in show.stdout
    assert "progress     step 0 of 7\n" in show.stdout
    again = acme.cli("jobs", "cancel", str(job_id))
    assert again.returncode == 2
    assert one_error_line(again) == "plexrl: error: HTTP 409: the job has cancelled; it cannot be cancelled"

    invalid = acme.cli("jobs", "submit", "--steps", "0")
    assert invalid.returncode == 2
    assert one_error_line(invalid).startswith("plexrl: error: HTTP 400: spec.steps: must be a positive integer")
    assert Job.objects.count() == 2


@pytest.mark.slow
def test_watch_prints_each_step_until_the_job_ends(acme):
    job_id = acme.client.submit(SPEC, name="watched")["id"]
    watch = acme.start_cli("jobs", "watch", str(job_id), "--poll", "0.2")
    try:
        seen = [watch.stdout.readline().rstrip("\n")]  # it is watching
        ingest(job_id, state(1, "running"), metrics(2, 1, 0.1), metrics(3, 2, 0.3))
        while not seen[-1].startswith("step     2"):  # the first steps, printed while the job runs
            seen.append(watch.stdout.readline().rstrip("\n"))
        assert watch.poll() is None
        ingest(job_id, metrics(4, 3, 0.6), metrics(5, 4, 0.9), state(6, "succeeded"))
        out, err = watch.communicate(timeout=30)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    lines = seen + out.splitlines()
    assert lines[0] == f"job {job_id} queued"
    assert lines[1] in (f"job {job_id} profiling", f"job {job_id} running")  # before its steps
    steps = [line for line in lines if line.startswith("step")]
    assert [int(line.split()[1]) for line in steps] == [1, 2, 3, 4]
    assert steps[-1] == "step     4  reward 0.900  accuracy 0.900  loss 0.0400  kl 0.0040  ▁▃▅█"  # reward so far
    assert lines[-1] == f"job {job_id} succeeded"

    # a failed job: the client's generator ends with it, the command exits 1
    failed_id = acme.client.submit(SPEC, name="doomed")["id"]
    ingest(failed_id, state(1, "running"), metrics(2, 1, 0.5), state(3, "failed", reason="out of memory"))
    updates = list(acme.client.watch(failed_id, poll_s=0.1))
    assert [u.kind for u in updates] == ["metrics", "state"]
    assert updates[-1].data["state"] == "failed"
    result = acme.cli("jobs", "watch", str(failed_id))
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == f"job {failed_id} failed (out of memory)"


def test_estimate_through_the_client_and_the_cli_and_on_submit(acme, tmp_path):
    from jobs.models import Job

    figures = acme.client.estimate(SPEC, rollout_devices=2, train_devices=2, deployment_mode="isolated_split")
    assert set(figures) == {"dedicated_device_hours", "multiplexed_device_hours", "savings", "step_seconds", "basis"}
    assert figures["basis"] == "model"  # the server's PLEXRL_HOME is fresh: no profiles
    assert 0 < figures["multiplexed_device_hours"] < figures["dedicated_device_hours"]
    with pytest.raises(ApiError) as err:
        acme.client.estimate(SPEC | {"steps": 0})
    assert (err.value.status, list(err.value.errors)) == (400, ["spec.steps"])

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC | {"name": "ignored", "rollout_devices": 2, "train_devices": 2,
                                            "deployment_mode": "isolated_split"}))
    as_json = acme.cli("jobs", "estimate", str(spec_file), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == pytest.approx(figures)
    line = acme.cli("jobs", "estimate", "--task", "arith", "--model", "tiny-arith", "--steps", "5", "--set",
                    "rollout=torch", "--set", "trainer=torch", "--rollout-devices", "2", "--train-devices", "2",
                    "--deployment-mode", "isolated_split", "--seed", "1")
    assert line.returncode == 0, line.stderr
    assert line.stdout.startswith(f"dedicated {figures['dedicated_device_hours']:.4g} device-hours, multiplexed "
                                  f"{figures['multiplexed_device_hours']:.4g} device-hours")
    assert "(from the cost model)" in line.stdout
    bad = acme.cli("jobs", "estimate", "--steps", "0")
    assert bad.returncode == 2
    assert one_error_line(bad).startswith("plexrl: error: HTTP 400: spec.steps:")
    assert not Job.objects.filter(organization=acme.organization).exists()  # estimates create nothing

    submit = acme.cli("jobs", "submit", str(spec_file))
    assert submit.returncode == 0, submit.stderr
    job = Job.objects.get(pk=int(submit.stdout))
    assert job.estimate == pytest.approx(figures)
    assert f"estimate: dedicated {figures['dedicated_device_hours']:.4g} device-hours" in submit.stderr


@pytest.mark.slow
def test_billing_report_shows_each_jobs_savings_and_the_csv_is_the_servers(acme):
    first = acme.client.submit(SPEC, name="small", rollout_devices=1, train_devices=1)["id"]
    second = acme.client.submit(SPEC, name="big", rollout_devices=4, train_devices=4)["id"]
    ingest(first, state(1, "running"), usage(2, 0.5), metrics(3, 1, 0.5))
    ingest(second, state(1, "running"), usage(2, 1.0, devices=2.0), metrics(3, 1, 0.5))

    report = acme.client.savings()
    assert {row["job"] for row in report["jobs"]} == {first, second}
    assert report["totals"]["billed_device_hours"] == pytest.approx(2.5, rel=1e-3)
    table = acme.cli("billing", "report")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["JOB", "NAME", "STATE"]
    by_job = {row.split()[0]: row for row in rows}
    for row in report["jobs"]:
        line = by_job[str(row["job"])]
        assert f"{row['billed_device_hours']:.4f}" in line
        assert f"{row['counterfactual_device_hours']:.4f}" in line
        assert f"{100 * row['savings']:.1f}%" in line
    assert rows[-1].split()[:4] == ["total", "2", "jobs", "2.5000"]

    exported = acme.cli("billing", "report", "--csv")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == acme.client.savings_csv().replace("\r\n", "\n")  # text mode reads CRLF as LF
    parsed = list(csv.DictReader(io.StringIO(exported.stdout)))
    assert {int(r["job"]) for r in parsed} == {first, second}


@pytest.mark.slow
def test_errors_are_one_line_with_exit_status_2_for_bad_input_and_1_when_unreachable(acme, globex):
    theirs = globex.client.submit(SPEC, name="theirs")["id"]
    with pytest.raises(NotFound) as err:
        acme.client.job(theirs)
    assert (err.value.status, str(err.value)) == (404, "HTTP 404: No Job matches the given query.")
    with pytest.raises(Unauthorized) as err:
        ServiceClient(acme.url, "plexrl_nonsense").jobs()
    assert err.value.status == 401
    assert isinstance(err.value, ApiError)
    assert isinstance(err.value, PlexRLError)
    with pytest.raises(Unreachable, match=r"^cannot reach the platform at http://127\.0\.0\.1:9/api/v1/jobs/: "):
        ServiceClient("http://127.0.0.1:9", "x").jobs()

    runs = {  # independent commands, run side by side
        "other org": acme.start_cli("jobs", "show", str(theirs)),
        "bad token": subprocess.Popen(_argv(["jobs", "list"]), env=acme.env(token="plexrl_nonsense"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=live.REPO),
        "no token": subprocess.Popen(_argv(["jobs", "list"]), env=acme.env(token=""), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=live.REPO),
        "unreachable": subprocess.Popen(_argv(["jobs", "list"]), env=acme.env(url="http://127.0.0.1:9"),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=live.REPO),
    }
    results = {}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=60)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert results["other org"].returncode == 2
    assert one_error_line(results["other org"]) == "plexrl: error: HTTP 404: No Job matches the given query."
    assert results["bad token"].returncode == 2
    assert one_error_line(results["bad token"]).startswith("plexrl: error: HTTP 401: ")
    assert results["no token"].returncode == 2
    assert one_error_line(results["no token"]).startswith("plexrl: error: --token: no API token")
    assert results["unreachable"].returncode == 1
    assert one_error_line(results["unreachable"]) == (
        "plexrl: error: cannot reach the platform at http://127.0.0.1:9/api/v1/jobs/: Connection refused")


# --- datasets -------------------------------------------------------------------------------------


def test_datasets_upload_list_and_delete_through_the_client_and_the_cli(acme, globex, tmp_path):
    from jobs.models import Dataset
    from tests.datafiles import csv_bytes, parquet_bytes

    rows = [{"n": i, "question": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(12)]
    (tmp_path / "sums.parquet").write_bytes(parquet_bytes(rows))
    dataset = acme.client.upload_dataset(tmp_path / "sums.parquet", "sums", prompt_column="question",
                                         answer_column="solution")
    assert (dataset["name"], dataset["problems"]) == ("sums", 12)
    assert [d["id"] for d in acme.client.datasets()] == [dataset["id"]]
    assert globex.client.datasets() == []  # another organization's: not there at all
    with pytest.raises(NotFound):
        globex.client.delete_dataset(dataset["id"])

    (tmp_path / "export.txt").write_bytes(csv_bytes(rows))
    (tmp_path / "eval.csv").write_bytes(csv_bytes(rows[:3]))
    upload = acme.cli("datasets", "upload", str(tmp_path / "export.txt"), "--name", "sums from csv", "--format",
                      "csv", "--prompt-column", "question", "--answer-column", "solution", "--eval-file",
                      str(tmp_path / "eval.csv"))
    assert upload.returncode == 0, upload.stderr
    from_csv = int(upload.stdout)  # the id alone on stdout
    assert Dataset.objects.get(pk=from_csv).eval_problems == 3
    assert "12 problems" in upload.stderr
    # the same problems, whatever the file: the same JSONL for the engine
    stored = {d.pk: Path(d.path).read_bytes() for d in Dataset.objects.all()}
    assert stored[from_csv] == stored[dataset["id"]]
    listing = acme.cli("datasets", "list")
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == ["ID", str(from_csv), str(dataset["id"])]

    bad = csv_bytes([*rows[:2], {"n": 2, "question": "x", "solution": ""}])
    (tmp_path / "bad.csv").write_bytes(bad)
    with pytest.raises(BadRequest, match='line 4: "solution" must be a non-empty string'):
        acme.client.upload_dataset(tmp_path / "bad.csv", "bad", prompt_column="question", answer_column="solution")
    refused = acme.cli("datasets", "upload", str(tmp_path / "bad.csv"), "--name", "bad")
    assert refused.returncode == 2
    assert one_error_line(refused) == ("plexrl: error: HTTP 400: file: no column 'prompt'; the file's columns: "
                                       "'n', 'question', 'solution'")
    assert Dataset.objects.count() == 2  # nothing of the refused uploads

    assert acme.cli("datasets", "delete", str(from_csv)).stdout == f"dataset {from_csv} deleted\n"
    assert [d["id"] for d in acme.client.datasets()] == [dataset["id"]]


# --- models ---------------------------------------------------------------------------------------


def test_models_upload_list_and_delete_through_the_client_and_the_cli(acme, globex, tmp_path):
    from jobs.models import RegisteredModel
    from tests.modelfiles import build_tiny_model

    folder = build_tiny_model(tmp_path / "my-qwen", "qwen2")
    model = acme.client.upload_model(folder, "my-qwen", description="tiny")
    assert (model["name"], model["scope"], model["architecture"]) == ("my-qwen", "organization", "Qwen2ForCausalLM")
    assert sorted(p.name for p in Path(RegisteredModel.objects.get(pk=model["id"]).path).iterdir()) == sorted(
        p.name for p in folder.iterdir())
    assert "my-qwen" in [m["name"] for m in acme.client.models()]
    assert "my-qwen" not in [m["name"] for m in globex.client.models()]  # another organization's: not there
    with pytest.raises(NotFound):
        globex.client.delete_model(model["id"])

    upload = acme.cli("models", "upload", str(folder), "--name", "again")
    assert upload.returncode == 0, upload.stderr
    again = int(upload.stdout)  # the id alone on stdout
    assert "Qwen2ForCausalLM, 103232 parameters" in upload.stderr
    listing = acme.cli("models", "list")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split()[:3] for line in listing.stdout.splitlines()[1:]]
    assert [str(again), "again", "organization"] in rows
    assert [str(model["id"]), "my-qwen", "organization"] in rows

    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(BadRequest, match=r"pytorch_model\.bin: pickle-based weights are not accepted"):
        acme.client.upload_model(folder, "bad")
    refused = acme.cli("models", "upload", str(folder), "--name", "bad")
    assert refused.returncode == 2
    assert one_error_line(refused).startswith("plexrl: error: HTTP 400: files: pytorch_model.bin: pickle-based")
    assert RegisteredModel.objects.count() == 2  # nothing of the refused uploads

    assert acme.cli("models", "delete", str(again)).stdout == f"model {again} deleted\n"
    assert [m["id"] for m in acme.client.models() if m["scope"] == "organization"] == [model["id"]]


# --- artifacts ------------------------------------------------------------------------------------


def test_a_jobs_final_weights_download_as_one_archive_that_transformers_loads_and_generates_with(acme, globex,
                                                                                                  tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from jobs import services

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config).eval()
    final = tmp_path / "engine" / "final"  # as a job's driver exports it
    model.save_pretrained(final, safe_serialization=True)
    job = services.job_create(organization=acme.organization, user=acme.owner, spec=SPEC, name="done")
    ingest(job.pk, {"seq": 1, "kind": "artifact", "ts": 1.0,
                    "data": {"name": "final", "path": str(final), "files": sorted(p.name for p in final.iterdir())}})

    folder = acme.client.download_artifact(job.pk, tmp_path / "sdk")
    assert folder == tmp_path / "sdk" / f"job-{job.pk}-final"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in final.iterdir())
    prompt = torch.tensor([[3, 4, 5]])
    loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, do_sample=False)
        assert torch.equal(loaded.generate(prompt, max_new_tokens=6, do_sample=False), expected)

    one_file = f"{acme.url}/api/v1/jobs/{job.pk}/artifacts/final/model.safetensors"  # or file by file
    assert acme.client._send(one_file, token=acme.token, accept="*/*") == (final / "model.safetensors").read_bytes()

    cli = acme.cli("jobs", "download", str(job.pk), "--out", str(tmp_path / "cli"))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == str(tmp_path / "cli" / f"job-{job.pk}-final")
    assert (tmp_path / "cli" / f"job-{job.pk}-final" / "model.safetensors").read_bytes() == \
        (final / "model.safetensors").read_bytes()

    with pytest.raises(NotFound):  # another organization's job: not there at all
        globex.client.download_artifact(job.pk, tmp_path / "outsider")
    assert not (tmp_path / "outsider").exists()
    missing = acme.cli("jobs", "download", str(job.pk), "--artifact", "other", "--out", str(tmp_path / "x"))
    assert missing.returncode == 2
    assert one_error_line(missing).startswith("plexrl: error: HTTP 404")


def test_a_jobs_metrics_and_spec_go_to_tensorboard_and_mlflow_read_back_by_their_own_readers(acme, globex, tmp_path,
                                                                                          monkeypatch):
    import zipfile

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job_id = acme.client.submit(SPEC, name="tracked")["id"]
    ingest(job_id, state(1, "running"), *(metrics(1 + step, step, 0.1 * step) for step in range(1, 6)),
           state(7, "succeeded"))
    scalars = {"reward_mean", "train_accuracy", "loss", "kl"}

    def read_tensorboard(folder) -> EventAccumulator:
        (events,) = list(folder.rglob("events.out.tfevents.*"))
        board = EventAccumulator(str(events.parent))
        board.Reload()
        return board

    # TensorBoard files written by the CLI, and downloaded from the platform: TensorBoard reads both
    result = acme.cli("jobs", "export", str(job_id), "--tensorboard", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    downloaded = tmp_path / "downloaded"
    zipfile.ZipFile(io.BytesIO(acme.client._send(f"{acme.url}/api/v1/jobs/{job_id}/tensorboard.zip",
                                                 token=acme.token, accept="*/*"))).extractall(downloaded)
    for board in (read_tensorboard(tmp_path / "runs" / "tracked"), read_tensorboard(downloaded)):
        assert set(board.Tags()["scalars"]) == scalars
        assert [(e.step, round(e.value, 6)) for e in board.Scalars("reward_mean")] == [
            (step, round(0.1 * step, 6)) for step in range(1, 6)]
        assert [e.step for e in board.Scalars("kl")] == [1, 2, 3, 4, 5]
        (spec,) = board.Tensors("spec")
        assert json.loads(spec.tensor_proto.string_val[0]) == acme.client.job(job_id)["spec"]
    with pytest.raises(NotFound):  # another organization's job
        globex.client._send(f"{globex.url}/api/v1/jobs/{job_id}/tensorboard.zip", token=globex.token)

    # an MLflow run in a local file store (which MLflow now asks to be allowed): its metrics by step
    # and the spec as parameters
    store = (tmp_path / "mlruns").as_uri()
    refused = acme.cli("jobs", "export", str(job_id), "--mlflow", store)
    assert refused.returncode == 1
    assert "MLFLOW_ALLOW_FILE_STORE" in one_error_line(refused)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    result = acme.cli("jobs", "export", str(job_id), "--mlflow", store, "--experiment", "acme-rl")
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split()[-1]
    tracker = MlflowClient(store)
    run = tracker.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "tracked"
    assert tracker.get_experiment(run.info.experiment_id).name == "acme-rl"
    assert set(run.data.metrics) == scalars
    history = tracker.get_metric_history(run_id, "reward_mean")
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(s, round(0.1 * s, 6)) for s in range(1, 6)]
    assert run.data.params["task"] == SPEC["task"]
    assert run.data.params["steps"] == str(SPEC["steps"])
    assert run.data.tags["plexrl.job_id"] == str(job_id)


def test_an_organizations_jobs_go_to_tensorboard_together_and_only_its_own(acme, globex, tmp_path):
    import zipfile

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ours = [acme.client.submit(SPEC, name="sweep")["id"] for _ in range(2)]  # one name, two runs
    for n, job_id in enumerate(ours):
        ingest(job_id, state(1, "running"), *(metrics(1 + step, step, 0.1 * step + n) for step in range(1, 4)),
               state(5, "succeeded" if n == 0 else "failed"))
    theirs = globex.client.submit(SPEC, name="theirs")["id"]
    ingest(theirs, state(1, "running"), metrics(2, 1, 0.5))

    def rewards(folder: Path) -> list[float]:
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1  # one run a folder
        board = EventAccumulator(str(folder))
        board.Reload()
        return [round(e.value, 6) for e in board.Scalars("reward_mean")]

    expected = {f"sweep-{job_id}": [round(0.1 * step + n, 6) for step in range(1, 4)] for n, job_id in enumerate(ours)}
    result = acme.cli("jobs", "export", "--all", "--tensorboard", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stderr
    assert {folder.name: rewards(folder) for folder in (tmp_path / "cli").iterdir()} == expected
    result = acme.cli("jobs", "export", "--all", "--state", "failed", "--tensorboard", str(tmp_path / "failed"))
    assert result.returncode == 0, result.stderr
    assert [folder.name for folder in (tmp_path / "failed").iterdir()] == [f"sweep-{ours[1]}"]

    # the same from the platform, as one archive; globex's holds only its own job
    zipfile.ZipFile(io.BytesIO(acme.client._send(f"{acme.url}/api/v1/jobs/tensorboard.zip", token=acme.token,
                                                 accept="*/*"))).extractall(tmp_path / "zip")
    (root,) = list((tmp_path / "zip").iterdir())
    assert {folder.name: rewards(folder) for folder in root.iterdir()} == expected
    names = zipfile.ZipFile(io.BytesIO(globex.client._send(f"{globex.url}/api/v1/jobs/tensorboard.zip",
                                                           token=globex.token, accept="*/*"))).namelist()
    assert [name.split("/")[1] for name in names] == [f"theirs-{theirs}"]

    for argv in (("jobs", "export", "--tensorboard", "x"), ("jobs", "export", "1", "--all", "--tensorboard", "x")):
        refused = acme.cli(*argv)
        assert refused.returncode == 2
        assert "--all" in one_error_line(refused)
    refused = acme.cli("jobs", "export", str(ours[0]), "--state", "failed", "--tensorboard", "x")
    assert refused.returncode == 2
    assert one_error_line(refused).startswith("plexrl: error: --state selects the jobs of --all")


def wandb_records(path: Path) -> Iterator:
    """The records of a W&B run file: a header, then the LevelDB log format (blocks of 32 KiB,
    each record a 7-byte header and its payload, split across blocks), each a ``Record``."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_a_jobs_metrics_and_spec_go_to_an_offline_wandb_run(acme, tmp_path):
    job_id = acme.client.submit(SPEC, name="tracked-wandb")["id"]
    ingest(job_id, state(1, "running"), *(metrics(1 + step, step, 0.1 * step) for step in range(1, 4)),
           state(5, "succeeded"))
    env = {"WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    result = subprocess.run(_argv(["jobs", "export", str(job_id), "--wandb", "acme-rl", "--wandb-dir",
                                   str(tmp_path)]), env=acme.env() | env, capture_output=True, text=True,
                            timeout=120, cwd=live.REPO)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split()[-1]
    (path,) = tmp_path.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    history, config, names = {}, {}, []
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[row.pop("_step")] = row
        elif kind == "run":  # its name and configuration (later ones would come as config records)
            names.append(record.run.display_name)
            config |= {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "config":
            config |= {item.key: json.loads(item.value_json) for item in record.config.update}
    assert names[0] == "tracked-wandb"
    assert sorted(history) == [1, 2, 3]
    assert [round(history[step]["reward_mean"], 6) for step in (1, 2, 3)] == [0.1, 0.2, 0.3]
    assert {"reward_mean", "train_accuracy", "loss", "kl"} <= set(history[3])
    assert config["task"] == SPEC["task"]
    assert config["steps"] == SPEC["steps"]
