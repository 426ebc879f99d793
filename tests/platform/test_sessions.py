"""Sessions through the SDK against a live platform (issue 33): daphne, a Celery worker on Redis
and the engine on a Ray head node of the test's own, as in production. A tenant's own loop
(``examples/grpo.py``, with its own reward) trains through the function API over REST; two
organizations' sessions share the worker groups, each sees only its own, and billing has each
session's device-seconds; bad, oversized and late calls are refused and run nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from plexrl_client import BadRequest, Conflict, NotFound, PayloadTooLarge, ServiceClient
from plexrl_client.webhooks import verify
from tests.platform import live
from tests.platform.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]
HOMES: dict[str, Path] = {}  # a live platform's URL -> its data directory
SESSION_IDLE_S = 15  # the platform's PLEXRL_SESSION_IDLE_S (a loop's calls come far more often)


@pytest.fixture(scope="module")
def platform(engine_home, django_db_setup, tmp_path_factory) -> Iterator[str]:
    """A Ray head node, a Celery worker and daphne, all on it; the platform's base URL (its data
    directory is ``HOMES[url]``)."""
    tmp = tmp_path_factory.mktemp("sessions")
    home = tmp / "home"
    home.mkdir()
    (home / "models").symlink_to(engine_home / "models")
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()
    env = live.platform_env(home) | {"PLEXRL_SESSION_IDLE_S": str(SESSION_IDLE_S)}
    with live.ray_cluster(env, tmp) as address:
        env = env | {"RAY_ADDRESS": address}
        worker = live.celery_worker(env, tmp, beat=True)  # its beat pulls the jobs' events
        server, url = live.asgi_server(env, tmp)
        HOMES[url] = home
        try:
            yield url
        finally:
            server.stop()
            worker.stop()
    broker.flushdb()


def organization(name: str, url: str) -> ServiceClient:
    from accounts.services import organization_create, token_create
    from billing.tasks import push_tenant
    from tests.platform.factories import UserFactory

    owner = UserFactory(username=f"{name}-owner")
    org = organization_create(name=name.capitalize(), owner=owner)
    push_tenant.delay(org.pk, 1e9, 1.0)
    return ServiceClient(url, token_create(user=owner, organization=org, name="sdk")[1], timeout=90)


def ingested(job_id: int) -> None:
    """Have the worker pull the job's events, as the beat's periodic pull does, until it has ended
    and all are in (this process has no engine: the worker's is the cluster's)."""
    import time

    from jobs import tasks
    from jobs.models import Job

    deadline = time.monotonic() + 120
    while not Job.objects.get(pk=job_id).events_complete:
        assert time.monotonic() < deadline, f"job {job_id} was not fully ingested"
        tasks.pull_events.delay(job_id)
        time.sleep(1.0)


def test_the_example_grpo_trains_through_the_sdk_with_its_own_reward(platform):
    from jobs.models import Job, JobMetric

    client = organization("acme", platform)
    # A few seconds. The rate: 1e-3 rises steadily here (held-out reward 0.25 -> 0.34, and so does
    # 1.5e-3); 3e-3 collapses on some CPUs (0.30 at step 6, 0.01 two steps later, 0.08 at the end).
    small = ["--prompts", "32", "--updates", "1", "--lr", "1e-3", "--temperature", "1.0"]
    done = subprocess.run([sys.executable, "examples/grpo.py", "--url", platform, "--token", client.token, *small],
                          capture_output=True, text=True, timeout=500, cwd=live.REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    ingested(out["session"])
    job = Job.objects.get(pk=out["session"])
    assert job.state == "succeeded"
    assert job.spec["algorithm"] == "session"
    steps = list(JobMetric.objects.filter(job=job).order_by("step").values_list("step", "data"))
    assert [s for s, _ in steps] == list(range(1, 42))  # the loop's own curve, on the job's page
    assert all("reward_mean" in data for _, data in steps[:-1])
    assert out["held_out_reward_after"] > out["held_out_reward_before"], out


def test_the_example_fine_tuning_loop_trains_through_the_sdk(platform):
    client = organization("sft", platform)
    done = subprocess.run([sys.executable, "examples/sft.py", "--url", platform, "--token", client.token,
                           "--steps", "15"], capture_output=True, text=True, timeout=500, cwd=live.REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    losses = [float(line.rsplit(" ", 1)[1]) for line in done.stderr.splitlines() if line.startswith("step ")]
    assert len(losses) == 15
    assert losses[-1] < losses[0]  # it learns the answers it is shown
    assert out["held_out_loss_after"] < out["held_out_loss_before"], out  # and answers it was not shown


def _step(session, seed: int) -> None:
    """One pipelined GRPO-like step of a session: every call sent before the first answer."""
    out = session.generate(texts=["2+3=", "11+4="], n=4, max_tokens=3, seed=seed)
    rows = out.completions
    done = [session.forward_backward_async(prompts=[out.prompts[c.prompt_index] for c in rows],
                                           completions=[c.token_ids for c in rows], loss="grpo",
                                           advantages=[1.0, -1.0] * 4, old_logprobs=[c.logprobs for c in rows]),
            session.optim_step_async(), session.sync_weights_async(), session.log_metrics_async(seed, reward=0.5)]
    assert [type(f.result(120)).__name__ for f in done] == ["LossResult", "dict", "dict", "dict"]


def test_two_organizations_sessions_share_the_groups_each_sees_its_own_and_each_is_billed(platform):
    from billing.models import UsageEntry
    from jobs.models import Job

    acme, globex = organization("acme-s", platform), organization("globex-s", platform)
    a = acme.create_session("tiny-arith", rollout="torch", trainer="torch", optimizer={"lr": 1e-3})
    g = globex.create_session("tiny-arith", rollout="torch", trainer="torch", optimizer={"lr": 1e-3})
    for seed in (1, 2):
        _step(a, seed)
        _step(g, seed)
    with pytest.raises(NotFound):  # another organization's session is not there
        globex.session(a.id, next_seq=100).optim_step()
    assert [j["id"] for j in globex.jobs()] == [g.id]
    with pytest.raises(PayloadTooLarge) as info:  # bounded: the limit in the answer, nothing run
        a.generate([[1, 2]] * 5000)
    assert info.value.errors["limit"] == ["4096"]
    with pytest.raises(BadRequest) as info:
        a.generate(texts=[""])
    assert "texts" in info.value.errors
    assert a.close()["closed"] == "closed by the tenant"
    g.close()
    with pytest.raises(Conflict):  # a closed session's calls are refused
        acme.session(a.id, next_seq=100).optim_step()
    for job_id in (a.id, g.id):
        ingested(job_id)
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=[a.id, g.id])}
    assert {job.state for job in jobs.values()} == {"succeeded"}
    billed = {job_id: list(UsageEntry.objects.filter(job_id=job_id).values_list("wpg", "device_seconds"))
              for job_id in jobs}
    assert all(rows and all(seconds > 0 for _, seconds in rows) for rows in billed.values())
    assert {w for w, _ in billed[a.id]} & {w for w, _ in billed[g.id]}  # one shared worker group at least
    assert {u["job"] for u in acme.usage()} == {a.id}  # each organization's bill is its own session's


def test_the_platforms_own_grpo_through_the_sdk_gives_the_preset_jobs_metrics_jsonl_byte_for_byte(platform,
                                                                                                   monkeypatch):
    """``engine.rl.grpo`` run here, every call through the SDK over HTTP (``RemoteClient`` over a
    ``Session``'s numbered calls), against the same job run as a preset on the platform."""
    from engine.paths import events_path
    from engine.rl import grpo
    from engine.service.remote_loop import RemoteClient
    from engine.spec import JobSpec
    from plexrl_client import Session
    from tests.platform.builders import ENGINE_SPEC

    monkeypatch.setenv("PLEXRL_HOME", str(HOMES[platform]))  # the tokenizer, read here from the model's folder
    client = organization("integrity", platform)
    preset = client.submit(ENGINE_SPEC, name="preset")
    opened = client._json("POST", "sessions/", body={"model": "tiny-arith", "rollout": "torch", "trainer": "torch"})
    session = Session(client, opened)
    spec = JobSpec.from_dict(ENGINE_SPEC)
    loop = RemoteClient(session._call, spec.model)  # the SDK's futures answer the engine's JSON
    grpo.train(loop, job=f"job-{opened['id']}", model=spec.model, task=spec.task, steps=spec.steps, seed=spec.seed,
               config=spec.grpo, tools=None, dataset=None)
    session.close()
    for job_id in (preset["id"], opened["id"]):
        ingested(job_id)

    def logged_metrics(job_id: int) -> list[str]:
        lines = events_path(HOMES[platform], f"job-{job_id}").read_text().splitlines()
        return [json.dumps(e["data"]) for e in map(json.loads, lines) if e["kind"] == "metrics"]

    assert len(logged_metrics(preset["id"])) == spec.steps
    assert logged_metrics(opened["id"]) == logged_metrics(preset["id"])
    downloaded = client.metrics_jsonl(preset["id"])  # metrics.jsonl, as the tenant downloads it
    assert downloaded.count(b"\n") == spec.steps
    assert client.metrics_jsonl(opened["id"]) == downloaded


def test_an_idle_session_is_closed_its_calls_answer_409_and_its_billing_stops(platform):
    import time

    from billing.models import UsageEntry

    client = organization("idle", platform)
    receiver = Receiver()  # the organization's webhook: the real worker delivers the session's end there
    hook = client._json("POST", "webhooks/", body={"url": receiver.url, "events": ["job.succeeded"]})
    session = client.create_session("tiny-arith", rollout="torch", trainer="torch")
    session.generate(texts=["1+2="], n=2, max_tokens=2)
    answered = time.monotonic()
    timing = session.timings[-1]  # where the call's time went: the engine's part is within it
    assert timing.fn == "generate"
    assert 0 < timing.engine_seconds < timing.seconds
    while client.job(session.id)["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() - answered < SESSION_IDLE_S + 60, "the idle session was not closed"
        time.sleep(0.5)
    job = client.job(session.id)
    assert job["state"] == "succeeded"
    assert time.monotonic() - answered >= SESSION_IDLE_S - 1
    assert f"closed after {SESSION_IDLE_S} s without a call" in job["state_reason"]
    with pytest.raises(Conflict):
        session.optim_step()
    ingested(session.id)
    billed = UsageEntry.objects.filter(job_id=session.id).count()
    assert billed > 0
    time.sleep(2.0)
    ingested(session.id)
    assert UsageEntry.objects.filter(job_id=session.id).count() == billed  # nothing after the close
    while not receiver.requests:
        assert time.monotonic() - answered < SESSION_IDLE_S + 120, "the webhook was not called"
        time.sleep(0.5)
    receiver.stop()
    ((headers, body),) = receiver.requests
    assert verify(hook["secret"], headers["PlexRL-Signature"], body)
    assert (json.loads(body)["event"], json.loads(body)["job"]["id"]) == ("job.succeeded", session.id)


def test_the_remote_bench_measures_the_sdk_paths_overhead_and_pipelined_calls(platform):
    """``plexrl bench remote``'s measurement, on this live platform (the command starts its own)."""
    from engine.bench.remote import measure

    session = organization("bench", platform).create_session("tiny-arith", rollout="torch", trainer="torch")
    result = measure(session, calls=6, pipeline=3, rows=2)
    session.close()
    # as every test here, it ends once the platform has all its events: a worker still writing them
    # while the test's tables are emptied deadlocks that flush (seen under `pytest -n 2`)
    ingested(session.id)
    assert result["sdk_call"]["p50_ms"] > result["in_engine_call"]["p50_ms"] > 0
    assert result["remote_overhead_p50_ms"] > 0
    assert result["calls_per_s_sequential"] > 0
    assert result["calls_per_s_pipelined"] > 0
    assert len(session.timings) == 6 + 6 + 1  # the one-at-a-time calls, the pipelined ones, close
