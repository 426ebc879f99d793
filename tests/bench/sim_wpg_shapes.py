"""Where the shared mode's held device-hours go: how many jobs its WPGs hold, how busy they are.

    .venv/bin/python tests/bench/sim_wpg_shapes.py [--gpus 512] [--jobs 250] [--seed 0] [--json]
                                                  [--admission PARAM=VALUE ...] [--sync host|gang]
                                                  [--partner-factor F]

Runs ``paper-math-backlog`` (its arrival rate per GPU, scaled to ``--gpus``, as
``tests/bench/sim_sweep.py`` does) under isolated split and under ``plexrl_backfill``, and prints
for the shared run: completion over isolated, held device-hours over the work floor, each side's
busy fraction (its share of the work floor over the device-seconds its WPGs were held), each
side's share of the held devices, and, time-weighted by devices while jobs waited (the backlog),
the jobs per WPG (mean and histogram) and the WPGs' load; and the jobs' measured demands
(medians). The README's held-over-floor bound for jobs in pairs is worked from these figures.
``--partner-factor``: the scheduler's ``idle_partner_factor`` (a call whose job's other WPGs idle
goes first). A benchmark: it prints a table (or JSON) and asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.cli.sim_commands import _admission as parse_admission  # noqa: E402
from engine.errors import CliError  # noqa: E402
from engine.scheduler.admission import Placer  # noqa: E402
from engine.sim.simulate import (  # noqa: E402
    ClusterSimulation,
    cluster_domains,
    run_mode,
    sim_admission,
    summarise,
    workload_costs,
    workload_job,
)
from engine.sim.workload import PRESETS, generate_jobs, plan_all  # noqa: E402

BASE = PRESETS["paper-math-backlog"]
KINDS = ("rollout", "train")


class ShapeWatch(ClusterSimulation):
    """The shared mode, counting its WPGs' devices, jobs and load over time, and the demands its
    jobs were measured at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held_by_kind: collections.Counter = collections.Counter()  # kind -> device-seconds held
        self.backlog: collections.Counter = collections.Counter()  # while jobs waited
        self.demands: list = []

    def _held(self, now: float) -> None:
        dt = now - self._held_since  # since the last count (``super()._held`` moves it on)
        if dt > 0:
            for slot in self.placer.slots.values():
                n = len(slot.devices)
                self.held_by_kind[slot.kind] += n * dt
                if self.placer.waiting:
                    self.backlog[(slot.kind, "devices")] += n * dt
                    self.backlog[(slot.kind, "jobs")] += n * dt * len(slot.jobs)
                    self.backlog[(slot.kind, "load")] += n * dt * slot.load
                    self.backlog[(slot.kind, len(slot.jobs))] += n * dt
        super()._held(now)

    def leave(self, r, now: float) -> None:
        self.demands.append(self.placer.demand(r.job.id))
        super().leave(r, now)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=250)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sync", choices=("host", "gang"), default="host")
    ap.add_argument("--admission", action="append", default=[], metavar="PARAM=VALUE")
    ap.add_argument("--partner-factor", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.partner_factor > 0:
        print(f"--partner-factor must be > 0, got {args.partner_factor}", file=sys.stderr)
        return 2
    w = dataclasses.replace(BASE, gpus=args.gpus, arrivals_per_s=BASE.arrivals_per_s / BASE.gpus * args.gpus)
    plans = plan_all(w, generate_jobs(w, args.jobs, args.seed))
    isolated = summarise(run_mode("isolated_split", w, plans), plans)

    try:
        admission = parse_admission(args.admission)  # as `plexrl sim --admission` reads them
    except CliError as exc:
        print(exc, file=sys.stderr)
        return 2
    groups = admission.pop("groups_per_domain", None)
    placer = Placer(cluster_domains(w, groups), sim_admission(w, "plexrl_backfill", **admission))
    costs = workload_costs(w)
    policy = dataclasses.replace(costs.policy, idle_partner_factor=args.partner_factor)
    costs = dataclasses.replace(costs, policy=policy)
    sim = ShapeWatch("plexrl_backfill", costs, placer, sync=args.sync)
    shared = summarise(sim.run([workload_job(w, p) for p in plans]), plans)

    floor = {"rollout": sum(p.cls.replica_gpus * p.rollout_s.sum() for p in plans),
             "train": sum(p.cls.train_gpus * (p.logprob_s.sum() + p.train_s.sum() + p.sync_s.sum()) for p in plans)}
    held = sum(sim.held_by_kind.values())
    out = {
        "gpus": args.gpus, "jobs": args.jobs, "seed": args.seed, "sync": args.sync, "admission": args.admission,
        "partner_factor": args.partner_factor,
        "completion_vs_isolated": shared["total_completion_s"] / isolated["total_completion_s"],
        "held_over_floor": shared["held_device_hours"] / shared["work_floor_device_hours"],
        "measured_demand_median": {k: statistics.median(getattr(d, k) for d in sim.demands) for k in KINDS},
    }
    for kind in KINDS:
        devices = sim.backlog[(kind, "devices")]
        out[kind] = {
            "busy": float(floor[kind] / sim.held_by_kind[kind]),
            "held_share": sim.held_by_kind[kind] / held,
            "backlog_jobs_per_wpg": sim.backlog[(kind, "jobs")] / devices,
            "backlog_load": sim.backlog[(kind, "load")] / devices,
            "backlog_jobs_histogram": {n: sim.backlog[(kind, n)] / devices
                                       for n in range(1, 9) if sim.backlog[(kind, n)]},
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"paper-math-backlog, {args.gpus} GPUs, {args.jobs} jobs, seed {args.seed}, {args.sync} sync"
          + (f", {' '.join(args.admission)}" if args.admission else "")
          + (f", partner factor {args.partner_factor:g}" if args.partner_factor != 1.0 else ""))
    print(f"completion / isolated {out['completion_vs_isolated']:.3f}   held / floor {out['held_over_floor']:.3f}")
    print(f"{'side':<9}{'busy':>7}{'held':>7}{'demand':>8}{'jobs/WPG':>10}{'load':>7}   jobs per WPG (share of time)")
    for kind in KINDS:
        k = out[kind]
        hist = "  ".join(f"{n}: {share:.3f}" for n, share in k["backlog_jobs_histogram"].items())
        print(f"{kind:<9}{k['busy']:>7.3f}{k['held_share']:>7.3f}{out['measured_demand_median'][kind]:>8.3f}"
              f"{k['backlog_jobs_per_wpg']:>10.2f}{k['backlog_load']:>7.3f}   {hist}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
