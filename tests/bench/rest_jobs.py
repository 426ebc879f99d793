"""Many small jobs submitted at once through the REST API, on the platform as production runs it:
the web server (uvicorn), a Celery worker with its beat (Redis broker), PostgreSQL, and the engine on
a Ray head node of ``--devices`` device slots. Issue 32's goal for 40 jobs on this machine: peak
engine memory under 8 GB, every job finishes, none fails for lack of memory.

    .venv/bin/python tests/bench/rest_jobs.py [--jobs 40] [--steps 2] [--devices 2] [--json]

Sets up a PostgreSQL database of its own (``plexrl_bench_jobs``, dropped and recreated, and dropped
again at the end) with one organization on a plan without a concurrent-job limit and an owner's
token; a PLEXRL_HOME of its own whose ``models/`` is linked from ``--models`` (``tiny-arith`` is
built there if missing); Redis database ``--redis-db`` (emptied before and after). It POSTs the
jobs to ``/api/v1/jobs/`` one after another as fast as the server answers, then polls the job list
every second until every job has ended, sampling the resident memory of the engine's processes
(``engine_load.engine_rss``: Ray's daemons and actor processes) and of the platform's (web server,
Celery worker), and counting driver processes and queued jobs.

Prints the jobs by final state (with the reasons of any that failed), the wall time, the peak
engine and platform memory, the peak of the machine's used memory, the most driver processes at
once and the largest driver's RSS, and the most jobs queued at once. ``--json`` prints it as JSON. A
benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import engine_rss  # noqa: E402
from rest_setup import bench_env, create_database, drop_database, web_server  # noqa: E402

DB = "plexrl_bench_jobs"
ENDED = ("succeeded", "failed", "cancelled")

# One plan without limits, for the bench's organization (the default plan caps concurrent jobs).
_UNLIMITED = """
from accounts.models import Organization, Plan
plan, _ = Plan.objects.update_or_create(name="bench-unlimited", defaults=dict(
    device_hours_per_month=None, max_concurrent_jobs=None, max_devices_per_job=None))
Organization.objects.update(plan=plan)
"""


def small_spec(steps: int, seed: int) -> dict:
    return {"task": "arith", "model": "tiny-arith", "steps": steps, "seed": seed, "rollout": "torch",
            "trainer": "torch", "grpo": {"prompts_per_step": 8, "samples_per_prompt": 4, "updates_per_step": 2,
                                         "eval_every": steps, "eval_size": 10, "max_tokens": 6}}


def platform_rss(roots: list[int]) -> int:
    """Bytes resident in the platform's processes (``roots`` and their children), Ray's excluded."""
    import psutil

    total = 0
    for pid in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            for proc in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if not (proc.cmdline() or [""])[0].startswith("ray::"):
                        total += proc.memory_info().rss
    return total


def drivers() -> list[int]:
    """The RSS (bytes) of each job driver process running now."""
    import psutil

    out = []
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::JobDriver") and proc.info["memory_info"] is not None:
            out.append(proc.info["memory_info"].rss)
    return out


def run(url: str, token: str, jobs: int, steps: int, roots: list[int]) -> dict:
    """Submit with the platform's SDK client (what users run), then follow the job list."""
    import psutil
    from tqdm import tqdm

    from plexrl_client import ServiceClient

    client = ServiceClient(url, token, timeout=60)
    started = time.monotonic()
    ids = [client.submit(small_spec(steps, seed=i), name=f"load {i}")["id"] for i in range(jobs)]
    submit_s = time.monotonic() - started
    peak = {"engine": 0, "platform": 0, "used": 0, "drivers": 0, "driver_rss": 0, "queued": 0}
    with tqdm(total=jobs, desc=f"{jobs} jobs", unit="job", disable=not sys.stderr.isatty()) as bar:
        while True:
            time.sleep(1.0)
            listed = [j for j in client.jobs() if j["id"] in ids]
            driver_rss = drivers()
            now = {"engine": engine_rss()[0], "platform": platform_rss(roots),
                   "used": psutil.virtual_memory().used, "drivers": len(driver_rss),
                   "driver_rss": max(driver_rss, default=0), "queued": sum(j["state"] == "queued" for j in listed)}
            peak = {k: max(v, now[k]) for k, v in peak.items()}
            ended = [j for j in listed if j["state"] in ENDED]
            bar.update(len(ended) - bar.n)
            if len(ended) == jobs:
                break
    wall = time.monotonic() - started
    states: dict[str, int] = {}
    for j in listed:
        states[j["state"]] = states.get(j["state"], 0) + 1
    failed = [j["state_reason"] for j in listed if j["state"] != "succeeded"]
    mb = 2**20
    return {"jobs": jobs, "steps": steps, "states": states, "not_succeeded_reasons": failed,
            "submit_s": round(submit_s, 1), "wall_s": round(wall, 1),
            "peak_engine_rss_mb": round(peak["engine"] / mb), "peak_platform_rss_mb": round(peak["platform"] / mb),
            "peak_machine_used_mb": round(peak["used"] / mb), "peak_driver_processes": peak["drivers"],
            "peak_driver_rss_mb": round(peak["driver_rss"] / mb), "peak_queued": peak["queued"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="device slots of the Ray head node")
    parser.add_argument("--redis-db", type=int, default=9)
    parser.add_argument("--models", type=Path,
                        default=Path(os.environ.get("PLEXRL_HOME", Path.home() / ".plexrl")) / "models")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from tests.platform import live

    home = Path(tempfile.mkdtemp(prefix="plexrl-jobs-"))
    logs = home / "logs"
    logs.mkdir()
    args.models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(args.models.resolve())
    os.environ["PLEXRL_HOME"] = str(home)
    from engine.models import resolve_model

    resolve_model("tiny-arith", progress=sys.stderr.isatty())  # built once, before any job asks for it
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    env = bench_env(DB) | {"PLEXRL_HOME": str(home), "REDIS_URL": redis_url}
    subprocess.run(["redis-cli", "-n", str(args.redis_db), "flushdb"], check=True, capture_output=True)
    fixture = create_database(DB, env, jobs=0)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", _UNLIMITED], cwd=REPO, env=env, check=True)
    try:
        with live.ray_cluster(env, logs, devices=args.devices) as address:
            env |= {"RAY_ADDRESS": address}
            worker = live.celery_worker(env, logs, beat=True)
            try:
                with web_server(env, logs / "web.log") as web:
                    out = run(web.url, fixture.token, args.jobs, args.steps, [web.process.pid, worker.pid])
            finally:
                worker.stop()
    finally:
        drop_database(DB)
        subprocess.run(["redis-cli", "-n", str(args.redis_db), "flushdb"], check=False, capture_output=True)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for key, value in out.items():
        print(f"  {key:24s} {value}")
    print(f"\n(data and logs: {home})")


if __name__ == "__main__":
    main()
