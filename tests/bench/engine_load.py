"""Engine load: many small jobs at once on the shared groups, and a soak of back-to-back jobs.

    .venv/bin/python tests/bench/engine_load.py --jobs 16 [--steps 5] [--json]
    .venv/bin/python tests/bench/engine_load.py --soak-minutes 10 [--in-flight 4] [--json]

Starts a local Ray and the engine service the way the platform does (``EngineClient``: one torch
rollout group and one torch train group, shared by every job), on a PLEXRL_HOME of its own whose
``models/`` is linked from ``--models`` (default: the user's PLEXRL_HOME, where ``make demo`` built
``tiny-arith``; missing presets are built).

- ``--jobs N``: submits N small jobs at once (distinct seeds) and waits for all of them. Prints how
  many succeeded, the wall time, each job's wall time (p50 / max), the device-seconds billed, the
  scheduler's switches, the peak resident memory of the engine's processes, and the most jobs
  running at once (each with a driver process) and waiting at once (queued: none).
- ``--soak-minutes M``: keeps ``--in-flight`` jobs running for M minutes, submitting the next job
  as one ends, and samples the resident memory (RSS, summed) of every engine process (the Ray
  actors: service, drivers, worker ranks, scheduler, StateManager) every ``--sample-s`` seconds.
  Prints the growth of the median RSS of the run's last minute over that of its middle minute (the
  issue's bound: under 5 % over the last half), and the jobs finished, by state.

A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TERMINAL = ("succeeded", "failed", "cancelled")


def small_spec(steps: int, seed: int):
    from engine.spec import GRPOConfig, JobSpec

    return JobSpec(task="arith", model="tiny-arith", steps=steps, seed=seed, rollout="torch", trainer="torch",
                   grpo=GRPOConfig(prompts_per_step=16, samples_per_prompt=4, updates_per_step=2, eval_every=steps,
                                   eval_size=20, max_tokens=8, temperature=1.0, checkpoint_every=2))


def engine_rss() -> tuple[int, dict[str, int]]:
    """Bytes resident in the engine's processes (Ray actor processes are titled ``ray::<Class>``,
    besides Ray's raylet and GCS), in all and by process kind."""
    import psutil

    by_class: dict[str, int] = {}
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = proc.info["cmdline"] or []
        if not cmd or proc.info["memory_info"] is None:
            continue
        if cmd[0].startswith("ray::"):
            name = cmd[0].removeprefix("ray::").split(".")[0].split(":")[0] or "IDLE"
        elif any(part.endswith(("/raylet", "/gcs_server")) for part in cmd[:1]):
            name = Path(cmd[0]).name  # Ray's own daemons
        else:
            continue
        by_class[name] = by_class.get(name, 0) + proc.info["memory_info"].rss
    return sum(by_class.values()), by_class


def start_engine(models: Path):
    home = Path(tempfile.mkdtemp(prefix="plexrl-load-"))
    if models.is_dir():
        (home / "models").symlink_to(models.resolve())
    os.environ["PLEXRL_HOME"] = str(home)
    from engine.control import EngineClient
    from engine.models import resolve_model
    from engine.spec import ServiceConfig

    resolve_model("tiny-arith", progress=True)  # built once, before any job asks for it
    return EngineClient(data_dir=home, config=ServiceConfig(devices_per_group=1.0, threads=1)), home


def usage_device_s(events: list[dict]) -> float:
    return sum(e["data"]["devices"] * (e["data"]["end"] - e["data"]["start"]) for e in events if e["kind"] == "usage")


def burst(engine, jobs: int, steps: int) -> dict:
    from tqdm import tqdm

    ids = [f"load-{i:02d}" for i in range(jobs)]
    started = time.monotonic()
    for i, job in enumerate(ids):
        engine.submit_job(job, small_spec(steps, seed=i))
    done: dict[str, str] = {}
    peak = peak_active = peak_queued = 0
    with tqdm(total=jobs * steps, desc=f"{jobs} jobs", unit="step") as bar:
        steps_seen = 0
        while len(done) < jobs:
            time.sleep(1.0)
            peak = max(peak, engine_rss()[0])
            total = active = queued = 0
            for job in ids:
                status = engine.status(job)
                if status.get("state") in TERMINAL:
                    done[job] = status["state"]
                active += bool(status.get("active"))  # a driver process: admitted, running
                queued += "position" in status  # waiting for room: no driver
                total += sum(1 for e in engine.events(job, 0, 10_000) if e["kind"] == "metrics")
            peak_active, peak_queued = max(peak_active, active), max(peak_queued, queued)
            bar.update(total - steps_seen)
            steps_seen = total
    wall = time.monotonic() - started
    per_job, billed = [], 0.0
    for job in ids:
        events = engine.events(job, 0, 10_000)
        states = {e["data"]["state"]: e["ts"] for e in events if e["kind"] == "state"}
        per_job.append(states[done[job]] - states["running"] if "running" in states else float("nan"))
        billed += usage_device_s(events)
    snapshot = engine.cluster_snapshot()["scheduler"]
    return {
        "jobs": jobs, "steps": steps,
        "states": {state: list(done.values()).count(state) for state in sorted(set(done.values()))},
        "wall_s": round(wall, 1),
        "job_wall_p50_s": round(statistics.median(per_job), 1), "job_wall_max_s": round(max(per_job), 1),
        "device_s_billed": round(billed, 1), "switches": snapshot["switches"],
        "switch_s": round(snapshot["switch_seconds"], 1), "peak_engine_rss_mb": round(peak / 2**20),
        "peak_drivers": peak_active, "peak_queued": peak_queued,
    }


def soak(engine, minutes: float, in_flight: int, steps: int, sample_s: float) -> dict:
    from tqdm import tqdm

    end = time.monotonic() + minutes * 60
    started = time.monotonic()
    running: list[str] = []
    finished: dict[str, str] = {}
    samples: list[tuple[float, int, dict[str, int]]] = []
    n = 0
    next_sample = 0.0
    with tqdm(total=int(minutes * 60), desc="soak", unit="s") as bar:
        while time.monotonic() < end:
            for job in list(running):
                state = engine.status(job).get("state")
                if state in TERMINAL:
                    running.remove(job)
                    finished[job] = state
            while len(running) < in_flight:
                job = f"soak-{n:04d}"
                engine.submit_job(job, small_spec(steps, seed=n))
                running.append(job)
                n += 1
            now = time.monotonic() - started
            if now >= next_sample:
                total, by_class = engine_rss()
                samples.append((now, total, by_class))
                next_sample = now + sample_s
            bar.n = min(int(now), bar.total)
            bar.set_postfix(jobs=len(finished), rss_mb=round(samples[-1][1] / 2**20))
            bar.refresh()
            time.sleep(1.0)
    for job in running:  # the last ones: ended so nothing lingers in the engine
        engine.cancel(job, reason="soak over")

    def median_rss(lo: float, hi: float) -> float:
        return statistics.median(s[1] for s in samples if lo <= s[0] < hi)

    total_s = minutes * 60
    middle = median_rss(total_s / 2, total_s / 2 + 60)
    last = median_rss(total_s - 60, total_s + 1)
    first = median_rss(0, 60)
    return {
        "minutes": minutes, "in_flight": in_flight, "steps_per_job": steps,
        "jobs_finished": {state: list(finished.values()).count(state) for state in sorted(set(finished.values()))},
        "rss_first_minute_mb": round(first / 2**20, 1), "rss_middle_minute_mb": round(middle / 2**20, 1),
        "rss_last_minute_mb": round(last / 2**20, 1),
        "growth_last_half_pct": round(100 * (last - middle) / middle, 2),
        "rss_by_process_last_mb": {k: round(v / 2**20, 1) for k, v in sorted(samples[-1][2].items())},
        "samples": [(round(t, 1), round(rss / 2**20, 1)) for t, rss, _ in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--models", type=Path,
                        default=Path(os.environ.get("PLEXRL_HOME", Path.home() / ".plexrl")) / "models")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.jobs and not args.soak_minutes:
        parser.error("say --jobs N, --soak-minutes M, or both")
    engine, home = start_engine(args.models)
    out: dict = {}
    try:
        if args.jobs:
            out["burst"] = burst(engine, args.jobs, args.steps)
        if args.soak_minutes:
            out["soak"] = soak(engine, args.soak_minutes, args.in_flight, args.steps, args.sample_s)
    finally:
        engine.shutdown()
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, result in out.items():
        print(f"\n{name}")
        for key, value in result.items():
            if key != "samples":
                print(f"  {key:28s} {value}")
    print(f"\n(engine data: {home})")


if __name__ == "__main__":
    main()
