"""What the REST benchmarks (``rest_latency.py``, ``rest_load.py``) share: a PostgreSQL database of
their own filled with one organization's jobs, and the web server started as production runs it.

Imported as a sibling module (``from rest_setup import ...``): the benchmarks are scripts run from
the repository root, so their own folder is first on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The production web command of README.md's "Production deployment" (one worker process per core),
# run from platform/; without its access log, which would cost the benchmark's own CPU time.
WORKERS = os.cpu_count() or 1
WEB_COMMAND = ["uvicorn", "--host", "127.0.0.1", "--workers", str(WORKERS), "--no-access-log",
               "config.asgi:application"]
WEB_SERVER = f"uvicorn ({WORKERS} worker processes)"


@dataclass(frozen=True)
class Fixture:
    """What the filled database holds: a viewer's token and the organization's job ids."""

    token: str
    job_ids: list[int]


def bench_env(db: str) -> dict[str, str]:
    """The environment of the platform processes: database ``db``, DEBUG off, no Redis or Ray."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE")}
    return {**env, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{db}", "PLEXRL_ENV": "development",
            "DJANGO_DEBUG": "false", "PYTHONPATH": str(REPO)}


def _psql(*commands: str) -> None:
    args = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q"]
    for command in commands:
        args += ["-c", command]
    subprocess.run(args, check=True, capture_output=True)


def drop_database(db: str) -> None:
    _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


# Run by ``manage.py shell``: each job has ``steps`` steps of metrics, a few events and two usage
# rows a step (a rollout and a training call), as the event pull would have stored them.
_FILL = """
import json
from accounts.services import organization_create, token_create
from accounts.models import User
from billing.models import UsageEntry
from billing.services import usage_totals_refresh
from jobs.models import Job, JobEvent, JobMetric
from engine.spec import JobSpec
STEPS = {steps}
user = User.objects.create_user("bench", password="bench-pass-1234")
org = organization_create(name="Bench", owner=user)
_, token = token_create(user=user, organization=org, name="bench")
spec = JobSpec(task="arith", model="tiny-arith", steps=STEPS, rollout="torch", trainer="torch").to_dict()
jobs = Job.objects.bulk_create([Job(organization=org, created_by=user, name=f"job {{i}}", spec=spec, state="running")
                                for i in range({jobs})])
metrics, events, usage = [], [], []
for job in jobs:
    t0 = 1.7e9 + job.pk * 1000
    events.append(JobEvent(job=job, seq=0, kind="state", data={{"state": "running"}}, ts=t0))
    for s in range(1, STEPS + 1):
        seq = 3 * s
        metrics.append(JobMetric(job=job, step=s, seq=seq, data={{"step": s, "reward_mean": 0.5, "loss": 0.1}}))
        events.append(JobEvent(job=job, seq=seq - 2, kind="log", data={{"message": f"step {{s}}"}}, ts=t0 + s))
        for k, fn in enumerate(("generate", "forward_backward")):
            start = t0 + 10 * s + 5 * k
            usage.append(UsageEntry(organization=org, job=job, seq=seq - 1 + k * 3 * STEPS, call=2 * s + k,
                                    role="policy", fn=fn, wpg=f"{{fn}}-0", devices=1.0, start=start, end=start + 4,
                                    setup_s=0.1, exec_s=3.9, queued_s=0.5, device_seconds=4.0))
JobMetric.objects.bulk_create(metrics, batch_size=5000)
JobEvent.objects.bulk_create(events, batch_size=5000)
UsageEntry.objects.bulk_create(usage, batch_size=5000)
for job in jobs:
    usage_totals_refresh(job_id=job.pk)  # as the event ingest keeps them
print(json.dumps({{"token": token, "ids": [job.pk for job in jobs]}}))
"""


def create_database(db: str, env: dict[str, str], *, jobs: int, steps: int = 20) -> Fixture:
    """Drop and recreate database ``db``, migrate it and fill it (one organization, ``jobs`` jobs)."""
    drop_database(db)
    _psql(f"CREATE DATABASE {db}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", _FILL.format(jobs=jobs, steps=steps)],
                         cwd=REPO, env=env, check=True, capture_output=True, text=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return Fixture(token=data["token"], job_ids=data["ids"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the web server exited ({server.returncode})")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:  # noqa: S310 - http://127.0.0.1 only
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the web server did not answer on {url}")


@dataclass(frozen=True)
class WebServer:
    url: str
    process: subprocess.Popen

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server and its worker processes so far."""
        import psutil

        root = psutil.Process(self.process.pid)
        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total


def postgres_cpu_seconds() -> float:
    """CPU time (user + system) of the PostgreSQL server's processes so far (0 when they cannot be
    read: another user's processes, where this does not run as root or postgres)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        if (proc.info["name"] or "").startswith(("postgres", "postmaster")) and proc.info["cpu_times"]:
            total += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return total


@contextlib.contextmanager
def web_server(env: dict[str, str], log: Path | None = None) -> Iterator[WebServer]:
    """The production web command serving ``env``'s database on a free port; yields it once
    ``/healthz`` answers, and stops it (and the worker processes it started) on exit."""
    port = free_port()
    out = log.open("w") if log else subprocess.DEVNULL
    server = subprocess.Popen([sys.executable, "-m", *WEB_COMMAND, "--port", str(port)], cwd=REPO / "platform",
                              env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server)
        yield WebServer(url, server)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if log:
            out.close()
