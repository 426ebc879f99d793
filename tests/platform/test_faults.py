"""Faults in the platform's own processes, each killed for real mid-run (issue 10): the job still
finishes, every metric point and usage entry of the engine's log is in PostgreSQL exactly once,
and nothing is billed twice.

The processes run as in production: a Ray head node of the test's own hosting the engine, a Celery
worker on Redis, PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from engine.paths import events_path
from tests.platform import live
from tests.platform.builders import ENGINE_SPEC

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


@pytest.fixture
def production(engine_home, django_db_setup, tmp_path):
    """A fresh data directory (the tiny model linked from the shared one) and a Ray head node;
    yields the environment of platform processes on them. Redis starts and ends empty."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(engine_home / "models")
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()
    env = live.platform_env(home)
    with live.ray_cluster(env, tmp_path) as address:
        yield env | {"RAY_ADDRESS": address}
    broker.flushdb()


def wait_for_log(proc: live.Process, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log.read_text(errors="replace"):
        proc.check_alive()
        assert time.monotonic() < deadline, f"{text!r} never appeared in {proc.log}:\n{proc.tail()}"
        time.sleep(0.05)


def engine_log(home: Path, job) -> list[dict]:
    return [json.loads(line) for line in events_path(home, job.engine_id).read_text().splitlines()]


def assert_ingested_exactly_once(job, events: list[dict]) -> None:
    """Every metrics event and usage record of the engine's log is in the database once, as logged."""
    from billing.models import UsageEntry
    from jobs.models import JobMetric

    logged = {e["seq"]: e["data"] for e in events if e["kind"] == "metrics"}
    stored = list(JobMetric.objects.filter(job=job).values_list("seq", "data"))
    assert sorted(seq for seq, _ in stored) == sorted(logged)  # none lost, none twice
    assert all(data == logged[seq] for seq, data in stored)
    usage = [e for e in events if e["kind"] == "usage"]
    billed = list(UsageEntry.objects.filter(job=job).values_list("seq", "device_seconds"))
    assert sorted(seq for seq, _ in billed) == sorted(e["seq"] for e in usage)
    assert len({seq for seq, _ in billed}) == len(billed)


def test_a_celery_worker_killed_mid_launch_loses_no_job(production, tmp_path):
    from accounts.services import organization_create
    from jobs import services, tasks
    from jobs.models import JobState
    from tests.platform.factories import UserFactory

    owner = UserFactory()
    org = organization_create(name="Fault Lab", owner=owner)
    job = services.job_create(organization=org, user=owner, spec=ENGINE_SPEC, name="tiny", rollout_devices=1,
                              train_devices=1)  # committed: its launch task is in Redis
    (tmp_path / "a").mkdir()
    # The first worker's engine address leads nowhere, so its launch hangs connecting and the kill
    # always lands before the engine hears of the job (with the real address, a kill just after
    # the engine call went out lets the engine finish the submit alone: no launch is lost then).
    first = live.celery_worker(production | {"RAY_ADDRESS": "127.0.0.1:1"}, tmp_path / "a")
    # received: the task has started ("Task jobs.tasks.launch_job[<id>] received"; the bare task name
    # is also in the start-up banner, printed before the worker takes any task)
    wait_for_log(first, "jobs.tasks.launch_job[", timeout=120)
    first.kill_group()  # no cleanup, no acknowledgement, as a lost node
    home = Path(production["PLEXRL_HOME"])
    assert not events_path(home, job.engine_id).exists(), "the kill came after the launch reached the engine"

    (tmp_path / "b").mkdir()
    second = live.celery_worker(production, tmp_path / "b")
    try:
        def done():
            job.refresh_from_db()
            return job.state == JobState.SUCCEEDED and job.events_complete

        live.wait_until(done, 360, "the job did not run to success after the worker was lost", [second],
                        poll=tasks.pull_all_events.delay, every=2.0)
        assert "launching it again" in second.log.read_text()
        events = engine_log(home, job)
        assert [e["data"]["state"] for e in events if e["kind"] == "state"] == ["queued", "running", "succeeded"]
        assert_ingested_exactly_once(job, events)
    finally:
        second.stop()


def restart_redis() -> None:
    """Stop the Redis server at once (nothing saved: it keeps nothing on disk) and start it again
    as ``.ci/run`` starts it; returns when it answers. Everything it held is gone."""
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "shutdown", "nosave"], capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while subprocess.run(["redis-cli", "-h", "127.0.0.1", "ping"], capture_output=True, text=True).stdout.strip() \
            == "PONG":
        assert time.monotonic() < deadline, "Redis did not stop"
        time.sleep(0.2)
    time.sleep(2)  # the worker and the beat notice the loss
    subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
                    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
                    "--logfile", "/var/log/redis/ci.log"], check=True, timeout=30)
    while subprocess.run(["redis-cli", "-h", "127.0.0.1", "ping"], capture_output=True, text=True).stdout.strip() \
            != "PONG":
        assert time.monotonic() < deadline + 30, "Redis did not come back"
        time.sleep(0.2)


def restart_postgres() -> None:
    """Restart the PostgreSQL cluster (every connection to it dropped), as ``.ci/run`` starts it;
    returns when it accepts connections again. This process's own connection is closed, so its
    next query opens a new one."""
    from django.db import connection

    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True,
                   timeout=120)
    deadline = time.monotonic() + 60
    while subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "PostgreSQL did not come back"
        time.sleep(0.2)
    connection.close()


@pytest.mark.parametrize("restart", [restart_redis, restart_postgres], ids=["redis", "postgres"])
def test_a_service_restart_mid_run_loses_nothing(production, tmp_path, restart):
    from jobs import services
    from jobs.models import JobMetric, JobState
    from tests.platform.factories import UserFactory

    owner = UserFactory()
    from accounts.services import organization_create

    org = organization_create(name="Fault Lab", owner=owner)
    spec = {**ENGINE_SPEC, "steps": 6}
    worker = live.celery_worker(production, tmp_path, beat=True)  # its beat pulls every 2 s
    try:
        job = services.job_create(organization=org, user=owner, spec=spec, name="tiny", rollout_devices=1,
                                  train_devices=1)
        live.wait_until(lambda: JobMetric.objects.filter(job=job).exists(), 300,
                        "no metric was ingested before the restart", [worker])
        restart()

        def done():
            job.refresh_from_db()
            return job.state == JobState.SUCCEEDED and job.events_complete

        live.wait_until(done, 300, f"the job was not fully ingested after {restart.__name__}", [worker],
                        every=2.0)
        events = engine_log(Path(production["PLEXRL_HOME"]), job)
        assert [e["data"]["step"] for e in events if e["kind"] == "metrics"] == [1, 2, 3, 4, 5, 6]
        assert_ingested_exactly_once(job, events)
    finally:
        worker.stop()


def test_a_web_server_killed_mid_run_leaves_its_clients_every_point_once(production, tmp_path):
    """A dashboard client on the job's socket loses its web server mid-run; it reconnects to a new
    one with ``?last_seq=`` (the highest seq it got) and ends with every metric point exactly once."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from accounts.services import organization_create, token_create
    from jobs import services
    from tests.platform.factories import UserFactory

    owner = UserFactory()
    org = organization_create(name="Fault Lab", owner=owner)
    _, plaintext = token_create(user=owner, organization=org, name="dashboard")
    headers = {"Authorization": f"Bearer {plaintext}"}
    worker = live.celery_worker(production, tmp_path, beat=True)
    (tmp_path / "web-1").mkdir()
    server, url = live.asgi_server(production, tmp_path / "web-1")
    received: list[dict] = []

    def listen(base: str, until_points: int, linger: float = 0.0, then=None) -> None:
        """Collect messages until ``until_points`` metric points arrived in all, then for
        ``linger`` seconds more (a duplicate would show there), or until the server goes away.
        ``then()``: called once the points arrived, the socket still open; reading goes on."""
        after = max((m["seq"] for m in received if m["type"] in ("metrics", "event")), default=0)
        with connect(f"{base.replace('http', 'ws')}/ws/jobs/{job.pk}/?last_seq={after}",
                     additional_headers=headers, open_timeout=30) as socket:
            deadline = None
            while deadline is None or time.monotonic() < deadline:
                try:
                    timeout = 240 if deadline is None else max(0.01, deadline - time.monotonic())
                    received.append(json.loads(socket.recv(timeout=timeout)))
                except ConnectionClosed:
                    return
                except TimeoutError:
                    if deadline is None:
                        return
                    continue
                if deadline is None and sum(m["type"] == "metrics" for m in received) >= until_points:
                    if then is not None:
                        then()  # the server dies under the open socket: the next recv sees it closed
                        then = None
                        continue
                    deadline = time.monotonic() + linger

    second = None
    try:
        job = services.job_create(organization=org, user=owner, spec={**ENGINE_SPEC, "steps": 6}, name="tiny",
                                  rollout_devices=1, train_devices=1)
        listen(url, until_points=2, then=server.kill_group)
        assert server.returncode is not None
        (tmp_path / "web-2").mkdir()
        second, url = live.asgi_server(production, tmp_path / "web-2")
        listen(url, until_points=6, linger=5.0)
        events = engine_log(Path(production["PLEXRL_HOME"]), job)
        logged = sorted(e["seq"] for e in events if e["kind"] == "metrics")
        got = [m["seq"] for m in received if m["type"] == "metrics"]
        assert sorted(got) == logged, (got, logged)  # every point, none twice, across the reconnect
        assert len(logged) == 6
        assert_ingested_exactly_once(job, events)
    finally:
        for proc in (second, worker):
            if proc is not None:
                proc.stop()
