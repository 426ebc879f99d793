"""``plexrl bench mux``: several real jobs, each alone on dedicated groups vs all on shared ones.

(a) Dedicated: the jobs run one after another, each on a rollout WPG and a train WPG of its own
    (the async-split style of deployment a job would otherwise reserve).
(b) Shared: all jobs at once on one rollout WPG and one train WPG with the same devices per WPG;
    the scheduler time-slices the two groups and swaps job states through the StateManager.

Device-seconds reserved = devices x wall time the groups are held. A device here is one CPU
core: every rank computes with one torch thread, so a WPG of one device cannot borrow another's.
Nothing is asserted; the result says whether each job's ``metrics.jsonl`` is byte-identical
between (a) and (b), and where (b)'s device time went (computing, switching, idle).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS

if TYPE_CHECKING:
    from engine.spec import JobSpec

DEVICES_PER_WPG = 1.0  # one device slot = one core, computed on by one thread


def job_shapes(jobs: int, steps: int, seed: int) -> list[tuple[str, JobSpec]]:
    """The bench's jobs: a tool-using one, a training-heavy one, then default ones, all with the
    GRPO defaults (512 prompts x 8 samples per step) except what makes their shape: the tool-using
    job's turns wait for the slowest of their calculator calls; the training-heavy one adds a frozen
    reference (KL penalty), recomputed old log-probs and twice the optimizer steps. Evaluations are
    smaller than a training run's (100 problems, twice per run): the bench is about device time."""
    from engine.spec import GRPOConfig, JobSpec

    base = GRPOConfig(eval_every=max(1, steps // 2), eval_size=100)
    default = JobSpec(task="arith", model="tiny-arith", steps=steps, seed=seed, rollout="torch", trainer="torch",
                      grpo=base)
    shapes = [
        ("tools", dataclasses.replace(default, task="arith-tools", model="tiny-arith-tools", seed=seed + 1)),
        # more passes on the train side per sample: a frozen reference's log-probs (KL penalty), old
        # log-probs recomputed by the trainer, and more, smaller optimizer steps
        ("train-heavy", dataclasses.replace(default, seed=seed + 2, grpo=dataclasses.replace(
            base, kl_coef=0.05, recompute_logprobs=True, updates_per_step=16))),
    ]
    i = 0
    while len(shapes) < jobs:
        shapes.append((f"default-{i}", dataclasses.replace(default, seed=seed + 3 + i)))
        i += 1
    return shapes[:jobs]


def _wall(events: list[dict]) -> tuple[float, float]:
    """(start, end) of a job: its "running" and its "succeeded" state events."""
    states = {e["data"]["state"]: e["ts"] for e in events if e["kind"] == "state"}
    return states["running"], states["succeeded"]


def _exec_by_fn(usage: list[dict]) -> dict[str, float]:
    by_fn: dict[str, list[float]] = defaultdict(list)
    for u in usage:
        if u.get("exec_s") is not None:
            by_fn[u["fn"]].append(u["exec_s"])
    return {fn: statistics.median(v) for fn, v in sorted(by_fn.items())}


def calls_by_function(usage: list[dict]) -> dict[str, dict[str, float]]:
    """Per "role/function": calls made, their execution seconds and the seconds they held their
    WPG (dispatch to completion, as the scheduler saw it), in all (a call held by two WPGs counts
    once)."""
    out: dict[str, dict[str, float]] = {}
    seen: set[int] = set()
    for u in usage:
        if u.get("exec_s") is None or u["call"] in seen:
            continue
        seen.add(u["call"])
        entry = out.setdefault(f"{u['role']}/{u['fn']}", {"count": 0, "exec_s": 0.0, "held_s": 0.0})
        entry["count"] += 1
        entry["exec_s"] += u["exec_s"]
        entry["held_s"] += u["end"] - u["start"]
    return dict(sorted(out.items()))


def bench_mux(*, jobs: int, steps: int, seed: int, max_resident: int = 2, progress: bool = False,
              out: Path | None = None) -> dict[str, Any]:
    """Run the mix each alone and all shared (``_run_dedicated``, ``_run_shared``), then compare."""
    from engine.models import resolve_model
    from engine.paths import default_run_dir
    from engine.service.runtime import EngineConfig, LocalEngine
    from engine.support.progress import progress_bar

    shapes = job_shapes(jobs, steps, seed)
    for _, spec in shapes:
        resolve_model(spec.model, progress=progress)  # build missing presets before any clock starts
    root = Path(out) if out else default_run_dir("bench-mux")
    bar = progress_bar(total=2 * jobs * steps, desc="bench mux", unit="step", enabled=progress)

    def count(_job: str, event: dict) -> None:
        if event["kind"] == "metrics":
            bar.update(1)

    config = EngineConfig(devices=int(2 * DEVICES_PER_WPG), threads_per_rank=1, num_cpus=2)
    with LocalEngine(config, data_dir=None) as engine:
        dedicated = _run_dedicated(engine, shapes, root, count)
        events, swaps = _run_shared(engine, shapes, root, count, max_resident)
    bar.close()
    return {"jobs": jobs, "steps": steps, "seed": seed, "devices_per_wpg": DEVICES_PER_WPG,
            "max_resident": max_resident, **mux_summary(shapes, root, dedicated, events, swaps), "out": str(root)}


def _start_pair(engine, prefix: str, swapping) -> list:
    """A rollout and a training torch WPG of ``DEVICES_PER_WPG`` each."""
    return [engine.start_group(f"{prefix}-{side}", "torch", devices_per_rank=DEVICES_PER_WPG, threads=1,
                               swapping=swapping, serves=serves)
            for side, serves in (("rollout", ROLLOUT_FUNCTIONS), ("train", TRAIN_FUNCTIONS))]


def _finish(runs: list, summaries: dict[str, dict]) -> dict[str, list[dict]]:
    """Write each run's outputs (metrics.jsonl beside its events) and return its events."""
    from engine.service.eventlog import read_events
    from engine.service.runtime import write_run_outputs

    out_events = {}
    for run in runs:
        write_run_outputs(run.events_path, run.events_path.parent, summaries[run.job_id])
        out_events[run.job_id] = read_events(run.events_path)
    return out_events


def _run_dedicated(engine, shapes, root: Path, count) -> dict[str, dict[str, Any]]:
    """(a) One job after another, each on a pair of groups of its own: wall time, execution
    seconds per function and calls, per job."""
    from engine.service.runtime import JobRun, run_jobs

    dedicated: dict[str, dict[str, Any]] = {}
    for name, spec in shapes:
        groups = _start_pair(engine, f"alone-{name}", None)
        run = JobRun(f"{name}-alone", spec, root / "dedicated" / name / "events.jsonl")
        events = _finish([run], run_jobs([run], groups, count, poll_s=0.05))[run.job_id]
        start, end = _wall(events)
        usage = [e["data"] for e in events if e["kind"] == "usage"]
        dedicated[name] = {"wall_s": end - start, "exec_s": _exec_by_fn(usage), "calls": calls_by_function(usage)}
        for g in groups:
            g.shutdown()
            engine.groups.remove(g)
    return dedicated


def _run_shared(engine, shapes, root: Path, count, max_resident: int) -> tuple[dict[str, list[dict]], list[dict]]:
    """(b) All jobs at once on one shared pair: their events, and each group's swap counters."""
    import ray

    from engine.service.runtime import JobRun, run_jobs
    from engine.workers.group import Swapping

    shared = _start_pair(engine, "shared", Swapping(max_resident=max_resident))
    runs = [JobRun(f"{name}-shared", spec, root / "shared" / name / "events.jsonl") for name, spec in shapes]
    events = _finish(runs, run_jobs(runs, shared, count, poll_s=0.05))
    return events, [ray.get(g.ranks[0].swap_stats.remote()) for g in shared]


def mux_summary(shapes, root: Path, dedicated: dict[str, dict[str, Any]], events: dict[str, list[dict]],
                swaps: list[dict]) -> dict[str, Any]:
    """The report part: device-seconds, makespans, the shared groups' breakdown and, per job, its
    slowdown and whether its metrics equal its run alone byte for byte."""
    spans = {f"{name}-shared": _wall(events[f"{name}-shared"]) for name, _ in shapes}
    first = min(s for s, _ in spans.values())
    makespan = max(e for _, e in spans.values()) - first
    devices = 2 * DEVICES_PER_WPG
    usage = [u["data"] for ev in events.values() for u in ev if u["kind"] == "usage"]
    busy = sum(u["devices"] * (u["end"] - u["start"]) for u in usage)
    setup = sum(u["devices"] * u["setup_s"] for u in usage)
    dedicated_ds = sum(devices * d["wall_s"] for d in dedicated.values())
    shared_ds = devices * makespan
    per_job = []
    for name, spec in shapes:
        a = (root / "dedicated" / name / "metrics.jsonl").read_bytes()
        b = (root / "shared" / name / "metrics.jsonl").read_bytes()
        start, end = spans[f"{name}-shared"]
        per_job.append({
            "job": name,
            "slowdown": (end - start) / dedicated[name]["wall_s"],
            "identical_metrics": a == b,
            "dedicated_wall_s": dedicated[name]["wall_s"],
            "shared_wall_s": end - start,
            "exec_s": dedicated[name]["exec_s"],
            "calls": dedicated[name]["calls"],
            "spec": spec.to_dict(),
        })
    return {
        "dedicated_device_seconds": dedicated_ds,
        "shared_device_seconds": shared_ds,
        "device_seconds_ratio": shared_ds / dedicated_ds,
        "makespan_s": makespan,
        "dedicated_makespan_s": sum(d["wall_s"] for d in dedicated.values()),
        "shared_utilisation": busy / shared_ds,
        "shared_breakdown": {
            "compute_device_seconds": busy - setup,
            "switch_device_seconds": setup,
            "idle_device_seconds": shared_ds - busy,
        },
        "switches": sum(s["in"] for s in swaps),
        "switch_seconds": sum(s["in_seconds"] for s in swaps),
        "swap_out_seconds": sum(s["out_seconds"] for s in swaps),
        "all_identical": all(p["identical_metrics"] for p in per_job),
        "per_job": per_job,
    }


def add_parser(bsub: argparse._SubParsersAction) -> None:
    m = bsub.add_parser("mux", help="N real jobs each alone on dedicated WPGs vs all on one shared pair")
    m.add_argument("--jobs", type=int, default=4)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--max-resident", type=int, default=2, help="job states each shared WPG holds at once")
    m.add_argument("--out", type=Path, default=None, help="where the runs' outputs go (default: under PLEXRL_HOME)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_bench_mux)


def cmd_bench_mux(args: argparse.Namespace) -> int:
    from engine.errors import SpecError
    from engine.support.progress import is_tty

    for field, value, low in (("--jobs", args.jobs, 1), ("--steps", args.steps, 1), ("--max-resident",
                                                                                      args.max_resident, 1)):
        if value < low:
            raise SpecError(field, f"must be >= {low}")
    r = bench_mux(jobs=args.jobs, steps=args.steps, seed=args.seed, max_resident=args.max_resident,
                  progress=is_tty(), out=args.out)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{'job':<14}{'alone s':>10}{'shared s':>10}{'slowdown':>10}  identical")
    for p in r["per_job"]:
        print(f"{p['job']:<14}{p['dedicated_wall_s']:>10.1f}{p['shared_wall_s']:>10.1f}{p['slowdown']:>10.2f}  "
              f"{p['identical_metrics']}")
    b = r["shared_breakdown"]
    print(f"device-seconds: dedicated {r['dedicated_device_seconds']:.1f}, shared {r['shared_device_seconds']:.1f} "
          f"(ratio {r['device_seconds_ratio']:.2f}); makespan {r['dedicated_makespan_s']:.1f} s -> "
          f"{r['makespan_s']:.1f} s")
    print(f"shared WPGs: utilisation {100 * r['shared_utilisation']:.0f} %; compute {b['compute_device_seconds']:.1f}, "
          f"switch {b['switch_device_seconds']:.1f}, idle {b['idle_device_seconds']:.1f} device-s; "
          f"{r['switches']} switches, {r['switch_seconds']:.2f} s swapping in")
    return 0

