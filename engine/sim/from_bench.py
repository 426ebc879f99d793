"""``plexrl sim --from-bench FILE``: predict a live ``plexrl bench mux`` or ``plexrl bench cluster``
shared run from its isolated (dedicated) runs.

Only what the isolated runs (a) measured is used: each job's spec (steps), its calls per
"role/function" with the seconds they held their WPG, and its isolated wall time. The shared run
(b) is then simulated: one rollout WPG and one train WPG of the bench's devices, each holding
``max_resident`` job states, every job arriving at once, the scheduler core with the live engine's
default policy. What (b) measured (device-seconds, makespan) is read only to compare.

A job's step, as the GRPO driver makes it (after, at its start, ``create`` on each side a role
has): its generate calls (turns and evaluations) on the
rollout WPG, then host time (reward, tool stalls: no WPG), then its log-prob passes, its
forward_backward / optim_step pairs on the train WPG, then ``sync_weights`` on both WPGs at once.
Counts per step are the run's counts spread evenly over its steps; each call holds its WPG for the
run's mean held seconds of that function; host time per step is the isolated wall time not spent
in calls, spread evenly.

A ``bench cluster`` output is replayed through the live engine's own placement: the placer with
the policy and declared demand the engine service runs (``engine.service.placing``), on the
bench's nodes and service config, in the cluster simulator (``ClusterSimulation``): each job
arrives when the bench sent its submission (``submitted_s``; all at 0 for an output without it),
groups are formed as the placer lays them, a job's new groups at once and one job's after
another's as the service forms them, taking the measured median start-up time of a group
(``group_start_s``); a job's driver starts once its groups are up, taking the measured median
from admission to the driver's first event (``driver_start_s``); groups are released when
empty; device-seconds are what the groups held.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from engine.scheduler.core import Policy
from engine.sim.simulate import CallSpec, SimJob, Stage, make_pool, run_pools

ROLLOUT_FNS = ("generate",)
ORDER = ("forward", "forward_backward", "optim_step")  # train-side functions in step order


def _per_step(total: int, steps: int, k: int) -> int:
    """Step ``k``'s share of ``total`` calls spread evenly over ``steps`` (shares sum to total)."""
    return total * (k + 1) // steps - total * k // steps


def bench_job(entry: dict[str, Any], switch_s: float, cls: str = "bench", arrival: float = 0.0) -> SimJob:
    steps = int(entry["spec"]["steps"])
    calls = entry["calls"]
    held = sum(c["held_s"] for c in calls.values())
    host = max(0.0, entry["dedicated_wall_s"] - held) / steps
    mean = {key: c["held_s"] / c["count"] for key, c in calls.items() if c["count"]}

    def split(key: str) -> tuple[str, str]:
        role, fn = key.split("/", 1)
        return role, fn

    gen = [k for k in calls if split(k)[1] in ROLLOUT_FNS]
    train = sorted((k for k in calls if split(k)[1] in ORDER), key=lambda k: (ORDER.index(split(k)[1]), k))
    sync = [k for k in calls if split(k)[1] == "sync_weights"]
    create = [k for k in calls if split(k)[1] == "create"]
    roles = {split(k)[0] for k in calls}

    def stages(k: int) -> list[Stage]:
        out: list[Stage] = []
        if k == 0:  # a role's first call makes it resident on each side it has: train first
            for key in create:
                role, fn = split(key)
                out.extend((CallSpec(fn, target, mean[key], role=role),)
                           for target in ("train", "rollout")[:calls[key]["count"]])

        def add(key: str, target: str) -> None:
            role, fn = split(key)
            out.extend((CallSpec(fn, target, mean[key], role=role),) for _ in range(_per_step(calls[key]["count"],
                                                                                              steps, k)))

        for key in gen:
            add(key, "rollout")
        out.append(host)
        fb = [key for key in train if split(key)[1] != "forward"]
        for key in train:
            if split(key)[1] == "forward":
                add(key, "train")
        # forward_backward and optim_step alternate, as the driver issues them
        pairs = [[(key, "train")] * _per_step(calls[key]["count"], steps, k) for key in fb]
        for i in range(max((len(p) for p in pairs), default=0)):
            for p in pairs:
                if i < len(p):
                    role, fn = split(p[i][0])
                    out.append((CallSpec(fn, "train", mean[p[i][0]], role=role),))
        for key in sync:
            add(key, "sync")
        return out

    switch = {(role, kind): switch_s for role in roles for kind in ("rollout", "train")}
    return SimJob(entry["job"], cls, arrival, steps, 1, (0.0, 0.0), switch, stages)


def predict(bench: dict[str, Any], *, switch_s: float = 0.05) -> dict[str, Any]:
    """Simulate the bench's shared run; ``switch_s``: seconds a job's state takes to swap into a
    WPG (the live scheduler's default estimate unless given)."""
    missing = [k for k in ("per_job", "max_resident", "devices_per_wpg") if k not in bench]
    if missing:
        raise ValueError(f"not a `plexrl bench mux --json` output: missing {', '.join(missing)}")
    if any("calls" not in e for e in bench["per_job"]):
        raise ValueError("this bench output has no per-job call counts (made by an older plexrl); rerun the bench")
    devices = bench["devices_per_wpg"]
    cap = int(bench["max_resident"])
    pool = make_pool("bench", "bench", Policy(), [(devices, cap)], [(devices, cap)])
    jobs = [bench_job(e, switch_s) for e in bench["per_job"]]
    result = run_pools("plexrl", [pool], jobs)
    makespan = max(result.finish.values())
    predicted = {
        "shared_device_seconds": 2 * devices * makespan,
        "makespan_s": makespan,
        "switches": result.switches,
        "per_job_wall_s": {j: result.finish[j] - result.start[j] for j in sorted(result.finish)},
    }
    measured = {"shared_device_seconds": bench["shared_device_seconds"], "makespan_s": bench["makespan_s"],
                "switches": bench.get("switches")}
    return {
        "predicted": predicted,
        "measured": measured,
        "error": {k: predicted[k] / measured[k] - 1 for k in ("shared_device_seconds", "makespan_s")},
        "switch_s": switch_s,
        "jobs": len(jobs),
    }


def predict_cluster(bench: dict[str, Any], *, switch_s: float = 0.05) -> dict[str, Any]:
    """Simulate a ``plexrl bench cluster`` output's shared run (see the module's docstring)."""
    from engine.service.cluster import SLOT_UNITS
    from engine.service.placing import declared, group_keys, live_policy, shape, view
    from engine.sim.simulate import ClassCosts, ClusterSimulation
    from engine.spec import JobSpec, ServiceConfig

    missing = [k for k in ("config", "nodes", "per_job", "group_start_s", "driver_start_s") if k not in bench]
    if missing or any("calls" not in e for e in bench.get("per_job", ())):
        raise ValueError("not a `plexrl bench cluster --json` output of this plexrl: missing "
                         + ", ".join(missing or ["per-job calls"]))
    config = dataclasses.replace(ServiceConfig(**bench["config"]), dedicated=False)
    units = round(config.devices_per_group * SLOT_UNITS)
    usage = [{"id": n["id"], "node_group": n["node_group"], "devices": n["devices"],
              "free_devices": float(n["devices"]), "held_devices": 0.0} for n in bench["nodes"]]
    placer, _ = view(usage, live_policy(config))
    entries = bench["per_job"]
    costs = ClassCosts({e["job"]: shape(group_keys(e["job"], JobSpec.from_dict(e["spec"])), units,
                                        config.max_resident) for e in entries},
                       dict.fromkeys((e["job"] for e in entries), declared(config)),
                       dict.fromkeys((e["job"] for e in entries), 0.0), Policy())
    arrival = {e["job"]: e.get("submitted_s", 0.0) for e in entries}  # as the bench submitted them
    sim = ClusterSimulation("plexrl", costs, placer, form_s=bench["group_start_s"] or 0.0,
                            driver_s=bench["driver_start_s"] or 0.0)
    result = sim.run([bench_job(e, switch_s, cls=e["job"], arrival=arrival[e["job"]]) for e in entries])
    predicted = {
        "shared_device_seconds": sim.held_device_s() / SLOT_UNITS,
        "makespan_s": max(result.finish.values()),
        "peak_wpgs": sim.held_peak // units,
        "switches": result.switches,
        "per_job_queued_s": {j: result.start[j] - arrival[j] for j in sorted(result.start)},
        "per_job_wall_s": {j: result.finish[j] - result.start[j] for j in sorted(result.finish)},
    }
    measured = {"shared_device_seconds": bench["shared_device_seconds"], "makespan_s": bench["shared_makespan_s"],
                "wpgs": len(bench.get("wpgs", ()))}
    return {
        "predicted": predicted,
        "measured": measured,
        "error": {k: predicted[k] / measured[k] - 1 for k in ("shared_device_seconds", "makespan_s")},
        "switch_s": switch_s,
        "group_start_s": bench["group_start_s"],
        "driver_start_s": bench["driver_start_s"],
        "jobs": len(entries),
    }


def predict_any(bench: dict[str, Any], *, switch_s: float = 0.05) -> dict[str, Any]:
    """``predict_cluster`` for a ``bench cluster`` output, else ``predict`` (``bench mux``)."""
    return (predict_cluster if bench.get("bench") == "cluster" else predict)(bench, switch_s=switch_s)


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--from-bench {path}: {exc}") from None
