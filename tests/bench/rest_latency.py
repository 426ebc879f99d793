"""REST latency under concurrent clients: job list and job detail, through a real ASGI server.

    .venv/bin/python tests/bench/rest_latency.py [--clients 20] [--seconds 20] [--jobs 200] [--json]

Sets up a PostgreSQL database of its own (``plexrl_bench_rest``, dropped and recreated), one
organization with ``--jobs`` jobs (each with 20 steps of metrics), a token, starts
``daphne config.asgi:application`` on a free port, and runs ``--clients`` threads that alternate
``GET /api/v1/jobs/`` and ``GET /api/v1/jobs/<id>/`` for ``--seconds``. Prints p50 / p99 per
endpoint and requests per second. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DB = "plexrl_bench_rest"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(env: dict[str, str], jobs: int) -> tuple[str, list[int]]:
    """Create the database, migrate, and fill it; returns (token, job ids)."""
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", f"DROP DATABASE IF EXISTS {DB}",
                    "-c", f"CREATE DATABASE {DB}"], check=True, capture_output=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    script = f"""
import json
from accounts.services import organization_create, token_create
from accounts.models import User
from jobs.models import Job, JobMetric
from engine.spec import JobSpec
user = User.objects.create_user("bench", password="bench-pass-1234")
org = organization_create(name="Bench", owner=user)
_, token = token_create(user=user, organization=org, name="bench")
spec = JobSpec(task="arith", model="tiny-arith", steps=20, rollout="torch", trainer="torch").to_dict()
ids = []
for i in range({jobs}):
    job = Job.objects.create(organization=org, created_by=user, name=f"job {{i}}", spec=spec, state="running")
    JobMetric.objects.bulk_create([JobMetric(job=job, step=s, seq=s, data={{"step": s, "reward_mean": 0.5}})
                                   for s in range(1, 21)])
    ids.append(job.pk)
print(json.dumps({{"token": token, "ids": ids}}))
"""
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["token"], data["ids"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}", "PLEXRL_ENV": "development",
           "DJANGO_DEBUG": "false", "PYTHONPATH": str(REPO)}
    token, ids = _setup(env, args.jobs)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "config.asgi:application"], cwd=REPO / "platform", env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/api/v1"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        for _ in range(100):  # wait for the server
            try:
                urllib.request.urlopen(urllib.request.Request(f"{base}/jobs/", headers=headers), timeout=2)  # noqa: S310 - http://127.0.0.1 only
                break
            except OSError:
                time.sleep(0.2)
        latencies: dict[str, list[float]] = {"list": [], "detail": []}
        errors = [0]
        lock = threading.Lock()
        stop = time.monotonic() + args.seconds

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop:
                for kind in ("list", "detail"):
                    url = f"{base}/jobs/" if kind == "list" else f"{base}/jobs/{rng.choice(ids)}/"
                    t0 = time.perf_counter()
                    try:
                        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:  # noqa: S310 - http://127.0.0.1 only
                            r.read()
                            ok = r.status == 200
                    except OSError:
                        ok = False
                    dt = time.perf_counter() - t0
                    with lock:
                        if ok:
                            latencies[kind].append(dt)
                        else:
                            errors[0] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
    finally:
        server.terminate()
        server.wait(timeout=10)

    def pct(xs: list[float], q: float) -> float:
        return 1000 * statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else float("nan")

    result = {
        "clients": args.clients, "seconds": round(wall, 1), "jobs": args.jobs, "errors": errors[0],
        **{kind: {"requests": len(xs), "p50_ms": round(pct(xs, 50), 1), "p99_ms": round(pct(xs, 99), 1)}
           for kind, xs in latencies.items()},
        "requests_per_s": round(sum(len(x) for x in latencies.values()) / wall, 1),
        "server": "daphne (one process), DEBUG off, PostgreSQL",
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{'endpoint':<10}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}")
        for kind in ("list", "detail"):
            r = result[kind]
            print(f"{kind:<10}{r['requests']:>10}{r['p50_ms']:>10}{r['p99_ms']:>10}")
        print(f"{result['requests_per_s']} requests/s with {args.clients} clients; {errors[0]} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
