"""Sensitivity of the simulator's headline ratios to the workload: for which RLVR workloads do the
paper's figures (-31...-38 % device-hours against async split; 0.56x the isolated completion time)
hold here, and for which do they not.

    .venv/bin/python tests/bench/sim_sweep.py [--gpus 512] [--jobs 250] [--seed 0 | --seeds 0,1,2,3]
                                              [--json] [--only NAME,...]

Each row is ``paper-math-backlog`` (the 1,000-job preset's arrival rate, scaled to ``--gpus``, so
every mode carries a backlog and completion measures capacity) with one thing changed: the
rollout's long tail (log-normal sigma and cap), the reward / tool-stall share of the step, the
offered load. Every mode runs on the same drawn jobs; the shared mode is ``plexrl_backfill`` with
the default admission policy, once with ``gang`` weight syncs (train and rollout WPGs held at once,
for every job) and once with ``host``, the live engine's (the train WPG only, the rollout WPGs
reloading from their node's host memory, wherever each rollout WPG is on one node).
With ``--seeds``, each row runs on every seed's drawn jobs and shows each ratio's median over them
(one seed's completion ratios move by a few hundredths with the draw). Columns: billed device-hours
over async split's, completion time over isolated split's (and async split's and colocated's, for
reference), held device-hours over the work floor. A benchmark: it prints a table (or JSON) and
asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.support import native  # noqa: E402

PURE_BECAUSE = native.enable()  # the compiled simulator (``make native``) where it matches the sources

from engine.sim.simulate import run_mode, summarise  # noqa: E402
from engine.sim.workload import PRESETS, Shares, Workload, generate_jobs, plan_all  # noqa: E402

BASE = PRESETS["paper-math-backlog"]
PER_GPU_RATE = BASE.arrivals_per_s / BASE.gpus  # the preset's arrivals per second per GPU

# name -> (what changed, overrides of the preset)
ROWS: dict[str, tuple[str, dict]] = {
    "preset": ("paper-math-backlog as written", {}),
    "tail-short": ("rollout tail sigma 0.5", {"length_sigma": 0.5}),
    "tail-long": ("rollout tail sigma 1.5", {"length_sigma": 1.5}),
    "cap-8k": ("responses capped at 8K", {"length_cap": 8192}),
    "cap-32k": ("responses capped at 32K", {"length_cap": 32768}),
    "reward-15": ("reward on CPU 15 % of the step", {"shares": Shares(rollout=0.45, reward=0.15)}),
    "tools": ("tool stalls (agentic-tools shares, 120 s stalls)",
              {"shares": PRESETS["agentic-tools"].shares, "tool_stall_s": 120.0, "tool_stall_sigma": 0.8,
               "length_median": 600.0, "length_cap": 8192}),
    "rollout-80": ("long chain-of-thought (long-cot shares and lengths)",
                   {"shares": PRESETS["long-cot"].shares, "length_median": 4000.0, "length_sigma": 1.1,
                    "length_cap": 28672}),
    "load-80": ("no backlog: paper-math's 80 % offered load", {"arrivals_per_s": None, "load": 0.8}),
}
DEDICATED = ("isolated_split", "async_split", "colocated")


def workload(gpus: int, overrides: dict) -> Workload:
    w = dataclasses.replace(BASE, gpus=gpus, arrivals_per_s=PER_GPU_RATE * gpus)
    return dataclasses.replace(w, name=f"{BASE.name}*", **overrides)


def row(name: str, gpus: int, jobs: int, seeds: list[int]) -> dict:
    """One row: its ratios on each seed's jobs (``per_seed``) and, at the top level, each ratio's
    median over the seeds (the seed alone when there is one)."""
    what, overrides = ROWS[name]
    w = workload(gpus, overrides)
    per_seed = [one_seed(w, jobs, seed) for seed in seeds]
    out: dict = {"row": name, "what": what}
    for key, value in per_seed[0].items():
        if isinstance(value, dict):
            out[key] = {k: statistics.median(s[key][k] for s in per_seed) for k in value}
        else:
            out[key] = statistics.median(s[key] for s in per_seed)
    out["per_seed"] = per_seed
    return out


def one_seed(w: Workload, jobs: int, seed: int) -> dict:
    plans = plan_all(w, generate_jobs(w, jobs, seed))
    out: dict = {"seed": seed}
    modes = {m: summarise(run_mode(m, w, plans), plans) for m in DEDICATED}
    for sync in ("gang", "host"):
        t0 = time.perf_counter()
        modes[f"plexrl_{sync}"] = summarise(run_mode("plexrl_backfill", w, plans, admission={"sync": sync}), plans)
        out[f"sim_s_{sync}"] = time.perf_counter() - t0
    iso, asy = modes["isolated_split"], modes["async_split"]
    for key, s in modes.items():
        out[key] = {
            "billed_vs_async": s["device_hours"] / asy["device_hours"],
            "completion_vs_isolated": s["total_completion_s"] / iso["total_completion_s"],
            "jct_vs_isolated": s["mean_job_completion_s"] / iso["mean_job_completion_s"],
            "held_over_floor": s["held_device_hours"] / s["work_floor_device_hours"],
        }
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'row':<12}{'billed/async':>13}{'':>7}{'completion/isolated':>22}{'':>19}{'held/floor':>12}{'':>7}"
            f"{'async':>7}{'coloc':>7}")
    sub = (f"{'':<12}{'gang':>7}{'host':>7}{'':>6}{'gang':>7}{'host':>7}{'async':>7}{'coloc':>7}{'':>13}"
           f"{'gang':>7}{'host':>7}")
    lines = [head, sub]
    for r in rows:
        g, h = r["plexrl_gang"], r["plexrl_host"]
        lines.append(
            f"{r['row']:<12}{g['billed_vs_async']:>7.3f}{h['billed_vs_async']:>7.3f}{'':>6}"
            f"{g['completion_vs_isolated']:>7.3f}{h['completion_vs_isolated']:>7.3f}"
            f"{r['async_split']['completion_vs_isolated']:>7.3f}{r['colocated']['completion_vs_isolated']:>7.3f}"
            f"{'':>13}{g['held_over_floor']:>7.3f}{h['held_over_floor']:>7.3f}"
            f"{r['async_split']['held_over_floor']:>7.3f}{r['colocated']['held_over_floor']:>7.3f}")
    lines.append("")
    lines += [f"{r['row']:<12}{r['what']}" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None,
                    help="comma-separated seeds, instead of --seed: each ratio is the median over them")
    ap.add_argument("--only", default=None, help="comma-separated rows (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        print(f"--only: unknown row(s) {', '.join(unknown)} (of {', '.join(ROWS)})", file=sys.stderr)
        return 2
    try:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        print(f"--seeds: expected comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        rows.append(row(name, args.gpus, args.jobs, seeds))
        print(f"  {name}: done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"gpus": args.gpus, "jobs": args.jobs, "seeds": seeds, "rows": rows,
                          "sim_compiled": PURE_BECAUSE is None}, indent=2))
    else:
        if len(seeds) > 1:
            print(f"medians over seeds {', '.join(map(str, seeds))}")
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
