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
groups are formed as the placer lays them, an admission round's new groups at once (later
rounds place jobs meanwhile, on them too), taking a group's start-up time (``group_start_s``); a
job's driver starts once its groups are all up, taking the time from then to the driver's first
event (``driver_start_s``); groups are released when empty, ``leave_s`` after their last job's end
(what the dedicated run's held device-seconds say that took); device-seconds are what the groups
held.

The bench's device slots are not devices: every node's groups and drivers share the machine's
``host_cpus``. Where the output says how many, the simulation shares them too, as the operating
system does (processor sharing): each running call, host stage and driver start-up wants a CPU,
and each group while it starts; while more are wanted than there are, each gets CPUs / wanted of
one, so what runs slows as others start and speeds up as they end. The dedicated run's
measurements are first brought back to what they take with the CPUs to themselves, by the share
they had there (``alone``: from each job's groups' start-up, its placement, its driver's start
and its end in that run).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from engine.scheduler.core import Policy
from engine.sim.simulate import CallSpec, SimJob, Stage, make_pool, run_pools

ROLLOUT_FNS = ("generate",)
ORDER = ("forward", "forward_backward", "optim_step")  # train-side functions in step order


def _per_step(total: int, steps: int, k: int) -> int:
    """Step ``k``'s share of ``total`` calls spread evenly over ``steps`` (shares sum to total)."""
    return total * (k + 1) // steps - total * k // steps


def bench_job(entry: dict[str, Any], switch_s: float, cls: str = "bench", arrival: float = 0.0,
              scale: float = 1.0) -> SimJob:
    """``entry``'s dedicated run as stages (see the module's docstring), each time times ``scale``."""
    steps = int(entry["spec"]["steps"])
    calls = entry["calls"]
    held = sum(c["held_s"] for c in calls.values())
    host = scale * max(0.0, entry["dedicated_wall_s"] - held) / steps
    mean = {key: scale * c["held_s"] / c["count"] for key, c in calls.items() if c["count"]}

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


def cpu_shares(activities: list[tuple[float, float, int]], cpus: float) -> list[float]:
    """Each activity's (start, end, CPUs it wants) mean share of what it wants over its span, the
    activities overlapping it wanting theirs (at most 1: an activity alone has its CPUs)."""
    edges = sorted({t for a, b, _ in activities for t in (a, b)})
    wanted = [(lo, hi, sum(w for a, b, w in activities if a <= lo and b >= hi)) for lo, hi in itertools.pairwise(edges)]
    shares = []
    for start, end, _ in activities:
        had = sum((min(hi, end) - max(lo, start)) * min(1.0, cpus / n) for lo, hi, n in wanted
                  if min(hi, end) > max(lo, start))
        shares.append(had / (end - start) if end > start else 1.0)
    return shares


def _group_start_s(bench: dict[str, Any], entry: dict[str, Any]) -> float:
    """Seconds the job's dedicated groups took to start: as measured for them, else the median."""
    own = entry.get("dedicated_group_start_s")
    return own if own is not None else bench["group_start_s"] or 0.0


def leave_s(bench: dict[str, Any], groups: dict[str, int], devices: float) -> float:
    """Seconds a dedicated group was held beyond its start-up and its job's time from its
    placement to its end, on average: until the service noticed the job's end and released its
    ``groups`` (of ``devices`` each)."""
    explained = sum(groups[e["job"]] * devices * (_group_start_s(bench, e) + e["dedicated_span_s"][1]
                                                  - e["dedicated_placed_s"]) for e in bench["per_job"])
    return max(0.0, (bench["dedicated_device_seconds"] - explained) / (devices * sum(groups.values())))


def alone(bench: dict[str, Any], groups: dict[str, int]) -> tuple[dict[str, float], float, float]:
    """What the dedicated run measured brought back to what it takes with CPUs to itself: per job
    the factor of its times (its share over its run, from its driver's start to its end), and a
    group's start-up and a driver's (the median over the jobs of each one's times the share it had).
    While a job's ``groups`` start (from its placement less their start-up) each wants a CPU; then
    its driver, until it runs; then the job, until its end."""
    cpus, entries = bench["host_cpus"], bench["per_job"]
    activities, what = [], []
    for e in entries:
        running, end = e["dedicated_span_s"]
        placed = e["dedicated_placed_s"]
        form = (placed - _group_start_s(bench, e), placed, groups[e["job"]])
        for kind, span in (("form", form), ("driver", (placed, running, 1)), ("run", (running, end, 1))):
            activities.append(span)
            what.append((kind, e["job"]))
    shares = cpu_shares(activities, cpus)
    by_kind: dict[str, list[float]] = {}
    for (kind, _), share, (start, stop, _) in zip(what, shares, activities, strict=True):
        by_kind.setdefault(kind, []).append((stop - start) * share)
    scale = {job: share for (kind, job), share in zip(what, shares, strict=True) if kind == "run"}
    return scale, statistics.median(by_kind["form"]), statistics.median(by_kind["driver"])


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
    keys = {e["job"]: group_keys(e["job"], JobSpec.from_dict(e["spec"])) for e in entries}  # its groups' kinds
    costs = ClassCosts({job: shape(kinds, units, config.max_resident) for job, kinds in keys.items()},
                       dict.fromkeys((e["job"] for e in entries), declared(config)),
                       dict.fromkeys((e["job"] for e in entries), 0.0), Policy())
    arrival = {e["job"]: e.get("submitted_s", 0.0) for e in entries}  # as the bench submitted them
    form_s, driver_s, scale, leave = bench["group_start_s"] or 0.0, bench["driver_start_s"] or 0.0, {}, 0.0
    cpus = bench.get("host_cpus") if all(e.get("dedicated_placed_s") is not None for e in entries) else None
    if cpus:  # a bench output that says when each dedicated job was placed, ran and ended
        groups = {job: len(kinds) for job, kinds in keys.items()}
        leave = leave_s(bench, groups, config.devices_per_group)
        scale, form_s, driver_s = alone(bench, groups)
    sim = ClusterSimulation("plexrl", costs, placer, form_s=form_s, driver_s=driver_s, cpus=cpus, leave_s=leave)
    result = sim.run([bench_job(e, switch_s, cls=e["job"], arrival=arrival[e["job"]], scale=scale.get(e["job"], 1.0))
                      for e in entries])
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
        "host_cpus": cpus,  # None: the CPUs were not shared in the simulation (an older bench output)
        "group_start_s": bench["group_start_s"],
        "driver_start_s": bench["driver_start_s"],
        # with host_cpus: a start-up as the simulation takes it, with the CPUs to itself
        "group_start_alone_s": form_s, "driver_start_alone_s": driver_s,
        "leave_s": leave,  # from a job's end to its groups' release, as the dedicated run held them
        "jobs": len(entries),
    }


def predict_any(bench: dict[str, Any], *, switch_s: float = 0.05) -> dict[str, Any]:
    """``predict_cluster`` for a ``bench cluster`` output, else ``predict`` (``bench mux``)."""
    return (predict_cluster if bench.get("bench") == "cluster" else predict)(bench, switch_s=switch_s)


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:  # the caller names the file
        raise ValueError(exc.strerror or str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
