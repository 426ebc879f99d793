"""``plexrl bench cluster``: the same jobs on a Ray cluster of several nodes, run twice through the
engine service, as the platform runs them:

(a) dedicated: each job on worker groups of its own (``ServiceConfig(dedicated=True)``), admitted
    first come first served while the nodes have device slots for them, its groups released when
    it ends: the reservation a job would otherwise hold;
(b) shared: the engine's own admission and placement (the placer's: a group takes jobs of its kind
    while their demands sum to the load limit, then another is formed where a node has room),
    groups released when no job uses them.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: a head node with no device slots
(the control plane) and ``--nodes`` worker nodes of ``--devices-per-node`` ``device`` slots, a node
group each. The jobs alternate between two model configurations (``tiny-arith`` and
``tiny-arith-tools``, another vocabulary), all on the ``arith`` task (so their times alone are
alike: the ``arith-tools`` task's tool stalls made its jobs up to 2.8 times longer), torch training
and torch or vLLM rollout (``--rollout``), small GRPO steps.

The jobs are submitted together, as a platform's workers would: each from a thread of its own,
``SEND_GAP_S`` apart so the engine takes them in in order (one submission waits for no other
job's groups).

Device-seconds are what the groups held, idle time included (the service's
``held_device_seconds``); makespan runs from the first submission to the last job's end. Per job:
its node groups, when its submission was sent (``submitted_s``), seconds queued, its wall time
shared over dedicated (slowdown), whether its metrics are identical in both runs, and its calls
per function in each run (``calls``, the dedicated run's, which ``plexrl sim --from-bench``
replays; ``shared_calls``), and when in the dedicated run it was placed and ran
(``dedicated_placed_s``, ``dedicated_span_s``) and how long its groups took to start
(``dedicated_group_start_s``). A device slot here is not a core: the nodes' slots share this
machine's CPUs (``host_cpus``, which ``--from-bench`` shares in its simulation; how busy they were
in each run: ``*_busy_cpu_s`` over ``*_polled_s``), so makespans say little about a cluster of
real devices (the device-seconds do). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.spec import JobSpec

MODELS = (("arith", "tiny-arith"), ("arith", "tiny-arith-tools"))
POLL_S = 1.0
SEND_GAP_S = 0.1  # between two jobs' submissions


def job_mix(jobs: int, steps: int, seed: int, rollout: str = "torch") -> list[tuple[str, JobSpec]]:
    """``jobs`` small GRPO jobs alternating between the two model configurations, seeds in order,
    a torch trainer and ``rollout`` (torch: one rollout group serves both configurations; vllm: a
    group per configuration)."""
    from engine.spec import GRPOConfig, JobSpec

    grpo = GRPOConfig(prompts_per_step=16, samples_per_prompt=4, updates_per_step=1, eval_every=steps,
                      eval_size=16, max_tokens=8, temperature=1.0)
    out = []
    for i in range(jobs):
        task, model = MODELS[i % len(MODELS)]
        out.append((f"job-{i}", JobSpec(task=task, model=model, steps=steps, seed=seed + i, rollout=rollout,
                                        trainer="torch", grpo=grpo)))
    return out


def _engine_rss_mb() -> float:
    """Resident memory of every Ray worker process on this machine (the engine: service, scheduler,
    drivers, ranks, StateManagers), MB."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["name", "cmdline", "memory_info"]):
        cmd = proc.info["cmdline"] or []
        if (proc.info["name"] or "").startswith("ray::") or (cmd and cmd[0].startswith("ray::")):
            total += proc.info["memory_info"].rss if proc.info["memory_info"] else 0
    return total / 2**20


def _busy_cpu_s() -> float:
    """CPU-seconds this machine's CPUs have been busy since boot (all but idle and I/O wait)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _run(address: str, root: Path, shapes, config, bar) -> dict[str, Any]:
    """Submit every job at once to a new engine service with ``config``; follow them to their end,
    sampling the cluster every ``POLL_S``. The jobs' events, the service's held device-seconds,
    the makespan, every WPG seen (name -> node), peak drivers, engine memory and one driver's memory."""
    from engine.control import SERVICE_NAME, EngineClient
    from engine.service.eventlog import TERMINAL_STATES

    client = EngineClient(address=address, data_dir=root, config=config, timeout_s=300)
    try:
        started, busy_at_start = time.time(), _busy_cpu_s()
        submitted: dict[str, float] = {}  # job -> when its submission was sent, seconds after the first one's
        with ThreadPoolExecutor(max_workers=len(shapes), thread_name_prefix="submit") as pool:
            sent = []
            for name, spec in shapes:
                submitted[name] = time.time() - started
                sent.append(pool.submit(client.submit_job, name, spec))
                time.sleep(SEND_GAP_S)
            for future in sent:
                future.result()
        events: dict[str, list[dict]] = {name: [] for name, _ in shapes}
        wpgs: dict[str, str] = {}
        start_s: dict[str, float] = {}  # group name -> seconds it took to start
        peak_drivers, peak_rss, peak_driver_rss, ended = 0, 0.0, 0.0, set()
        while len(ended) < len(shapes):
            snap = client.cluster_snapshot()
            wpgs.update({w["name"]: w["node"] for w in snap["wpgs"]})
            start_s.update({w["name"]: w["start_s"] for w in snap["wpgs"] if w.get("start_s") is not None})
            peak_drivers = max(peak_drivers, len(snap["drivers"]))
            peak_driver_rss = max([peak_driver_rss, *(d["rss_mb"] or 0.0 for d in snap["drivers"])])
            peak_rss = max(peak_rss, _engine_rss_mb())
            for name in events:
                batch = client.events(name, events[name][-1]["seq"] if events[name] else 0)
                events[name] += batch
                bar.update(sum(1 for e in batch if e["kind"] == "metrics"))
                if any(e["kind"] == "state" and e["data"]["state"] in TERMINAL_STATES for e in batch):
                    ended.add(name)
            time.sleep(POLL_S)
        busy, polled = _busy_cpu_s() - busy_at_start, time.time() - started  # to the last poll (past the last end)
        last = max(e["ts"] for evs in events.values() for e in evs if e["kind"] == "state")
        # a last look: groups released as the last job ended stop counting then
        held = client.cluster_snapshot()["held_device_seconds"]
        return {"events": events, "held_device_seconds": held, "started": started, "makespan_s": last - started,
                "busy_cpu_s": busy, "polled_s": polled,
                "wpgs": wpgs,
                "submitted_s": submitted,
                "group_start_s": start_s,
                "peak_drivers": peak_drivers, "peak_engine_rss_mb": peak_rss, "peak_driver_rss_mb": peak_driver_rss}
    finally:
        client.shutdown()
        _wait_gone(SERVICE_NAME)  # the next run starts a service of its own under that name


def _wait_gone(name: str, timeout_s: float = 60.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="plexrl")
        except ValueError:
            return
        time.sleep(0.2)


def _per_job(name: str, spec: JobSpec, dedicated: dict[str, Any], shared: dict[str, Any],
             node_group: dict[str, str]) -> dict:
    def states(events: list[dict]) -> dict[str, float]:
        return {e["data"]["state"]: e["ts"] for e in events if e["kind"] == "state"}

    def placed(events: list[dict]) -> float | None:
        """When the job was admitted (its groups formed)."""
        return next((e["ts"] for e in events if e["kind"] == "placed"), None)

    def driver_start(events: list[dict], at: dict[str, float]) -> float | None:
        """From the job's admission to its driver's first event."""
        admitted = placed(events)
        return at["running"] - admitted if admitted is not None and "running" in at else None

    def metrics(events: list[dict]) -> list[dict]:
        return [e["data"] for e in events if e["kind"] == "metrics"]

    d, s = dedicated["events"][name], shared["events"][name]
    ds, ss = states(d), states(s)
    admitted = placed(d)
    own = next((e["data"].get("groups", ()) for e in d if e["kind"] == "placed"), ())
    own_start = [dedicated["group_start_s"][g] for g in own if g in dedicated["group_start_s"]]
    end = {k: v.get("succeeded", v.get("failed", 0.0)) for k, v in (("d", ds), ("s", ss))}
    wall = {k: end[k] - v.get("running", 0.0) for k, v in (("d", ds), ("s", ss))}
    from engine.bench.mux import calls_by_function

    used = {u["data"]["wpg"] for u in s if u["kind"] == "usage"}
    return {"job": name, "state": list(ss)[-1] if ss else None,
            "node_group": sorted({node_group.get(shared["wpgs"].get(w, ""), "?") for w in used}),
            "submitted_s": shared["submitted_s"][name],  # after the first submission (the sim's arrival)
            "queued_s": ss.get("running", 0.0) - ss.get("queued", 0.0),
            "dedicated_queued_s": ds.get("running", 0.0) - ds.get("queued", 0.0),
            "driver_start_s": driver_start(s, ss), "dedicated_driver_start_s": driver_start(d, ds),
            "dedicated_wall_s": wall["d"], "shared_wall_s": wall["s"],
            # in the dedicated run, seconds after its start: when its groups were up, and from its
            # driver's start to its end (what ran beside what, sharing this machine's ``host_cpus``)
            "dedicated_placed_s": None if admitted is None else admitted - dedicated["started"],
            # seconds its dedicated groups took to start (the slowest), up at ``dedicated_placed_s``
            "dedicated_group_start_s": max(own_start) if own_start else None,
            "dedicated_span_s": [ds.get("running", 0.0) - dedicated["started"], end["d"] - dedicated["started"]],
            "slowdown": wall["s"] / wall["d"] if wall["d"] > 0 else None,
            "identical_metrics": bool(metrics(d)) and metrics(d) == metrics(s),
            # what its dedicated run measured, for `plexrl sim --from-bench`
            "spec": spec.to_dict(), "calls": calls_by_function([u["data"] for u in d if u["kind"] == "usage"]),
            # what its shared run measured, to compare with the prediction (never read by it)
            "shared_calls": calls_by_function([u["data"] for u in s if u["kind"] == "usage"])}


def bench_cluster(*, nodes: int, devices_per_node: int, jobs: int, steps: int, seed: int, rollout: str = "torch",
                  progress: bool = False, out: Path | None = None) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from engine.models import resolve_model
    from engine.paths import default_run_dir
    from engine.service.cluster import read_nodes
    from engine.spec import ServiceConfig
    from engine.support.progress import progress_bar

    shapes = job_mix(jobs, steps, seed, rollout)
    for _, model in MODELS:
        resolve_model(model, progress=progress)  # built before any clock starts
    root = Path(out) if out else default_run_dir("bench-cluster")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(nodes):
        cluster.add_node(num_cpus=2, resources={"device": devices_per_node})
    ray.init(address=cluster.address, namespace="plexrl", log_to_driver=False)
    bar = progress_bar(total=2 * jobs * steps, desc="bench cluster", unit="step", enabled=progress)
    try:
        cluster.wait_for_nodes()
        listed = read_nodes()
        node_group = {n.id: n.node_group for n in listed}
        base = ServiceConfig(devices_per_group=1.0, threads=1, idle_release_s=0.0)
        dedicated = _run(cluster.address, root / "dedicated", shapes, dataclasses.replace(base, dedicated=True), bar)
        shared = _run(cluster.address, root / "shared", shapes, base, bar)
    finally:
        bar.close()
        ray.shutdown()
        cluster.shutdown()
    per_job = [_per_job(name, spec, dedicated, shared, node_group) for name, spec in shapes]
    started = list(dedicated["group_start_s"].values())
    drivers = [p["dedicated_driver_start_s"] for p in per_job if p["dedicated_driver_start_s"] is not None]
    return {
        "bench": "cluster",
        "config": dataclasses.asdict(base),
        "nodes": [{"id": n.id, "node_group": n.node_group, "devices": n.devices} for n in listed],
        # seconds a worker group took to start, median over the dedicated run's (all new)
        "group_start_s": statistics.median(started) if started else None,
        # seconds from a job's admission to its driver's first event, median over the dedicated run's
        "driver_start_s": statistics.median(drivers) if drivers else None,
        "wpgs": [{"name": w, "node": node, "node_group": node_group.get(node)}
                 for w, node in sorted(shared["wpgs"].items())],
        "dedicated_wpgs": len(dedicated["wpgs"]),
        "jobs": jobs, "steps": steps, "seed": seed, "rollout": rollout,
        # the CPUs every node's device slots and drivers share here (``plexrl sim --from-bench``)
        "host_cpus": len(os.sched_getaffinity(0)),
        "dedicated_device_seconds": dedicated["held_device_seconds"],
        "shared_device_seconds": shared["held_device_seconds"],
        "device_seconds_ratio": shared["held_device_seconds"] / dedicated["held_device_seconds"],
        "dedicated_makespan_s": dedicated["makespan_s"], "shared_makespan_s": shared["makespan_s"],
        # CPU-seconds the machine was busy in each run (to its last poll, ``*_polled_s`` after its start)
        "dedicated_busy_cpu_s": dedicated["busy_cpu_s"], "shared_busy_cpu_s": shared["busy_cpu_s"],
        "dedicated_polled_s": dedicated["polled_s"], "shared_polled_s": shared["polled_s"],
        "makespan_ratio": shared["makespan_s"] / dedicated["makespan_s"],
        "per_job": per_job,
        "state_moves": 0,  # the live engine does not move a job's state between nodes yet
        "cross_node_bytes": None,  # not measured: no move, and syncs go through Ray's object store
        "peak_engine_rss_mb": max(dedicated["peak_engine_rss_mb"], shared["peak_engine_rss_mb"]),
        "peak_driver_processes": {"dedicated": dedicated["peak_drivers"], "shared": shared["peak_drivers"]},
        "peak_driver_rss_mb": max(dedicated["peak_driver_rss_mb"], shared["peak_driver_rss_mb"]),
        "out": str(root),
    }


def add_parser(bsub: argparse._SubParsersAction) -> None:
    m = bsub.add_parser("cluster", help="N jobs on a several-node Ray cluster: dedicated groups vs the shared engine")
    m.add_argument("--nodes", type=int, default=3)
    m.add_argument("--devices-per-node", type=int, default=2)
    m.add_argument("--jobs", type=int, default=8)
    m.add_argument("--steps", type=int, default=4)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--rollout", choices=("torch", "vllm"), default="torch", help="the jobs' rollout backend")
    m.add_argument("--out", type=Path, default=None, help="where the runs' outputs go (default: under PLEXRL_HOME)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_bench_cluster)


def cmd_bench_cluster(args: argparse.Namespace) -> int:
    from engine.errors import SpecError
    from engine.support.progress import is_tty

    for field, value in (("--nodes", args.nodes), ("--devices-per-node", args.devices_per_node),
                         ("--jobs", args.jobs), ("--steps", args.steps)):
        if value < 1:
            raise SpecError(field, "must be >= 1")
    if args.devices_per_node < 2:
        raise SpecError("--devices-per-node", "must be >= 2 (a job's two groups go on one node group)")
    r = bench_cluster(nodes=args.nodes, devices_per_node=args.devices_per_node, jobs=args.jobs, steps=args.steps,
                      seed=args.seed, rollout=args.rollout, progress=is_tty(), out=args.out)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{'job':<8}{'state':<11}{'node group':<14}{'queued s':>9}{'alone s':>9}{'shared s':>10}{'slowdown':>10}"
          "  identical")
    for p in r["per_job"]:
        slowdown = "-" if p["slowdown"] is None else f"{p['slowdown']:.2f}"
        print(f"{p['job']:<8}{p['state'] or '-':<11}{','.join(g[:12] for g in p['node_group']):<14}"
              f"{p['queued_s']:>9.1f}{p['dedicated_wall_s']:>9.1f}{p['shared_wall_s']:>10.1f}{slowdown:>10}  "
              f"{p['identical_metrics']}")
    print(f"device-seconds: dedicated {r['dedicated_device_seconds']:.0f}, shared {r['shared_device_seconds']:.0f} "
          f"(ratio {r['device_seconds_ratio']:.2f}); makespan {r['dedicated_makespan_s']:.0f} s -> "
          f"{r['shared_makespan_s']:.0f} s (ratio {r['makespan_ratio']:.2f})")
    print(f"shared WPGs on {len({w['node'] for w in r['wpgs']})} node(s): "
          + ", ".join(f"{w['name']}@{(w['node'] or '-')[:12]}" for w in r["wpgs"]))
    print(f"peak engine memory {r['peak_engine_rss_mb']:.0f} MB; peak drivers {r['peak_driver_processes']}, "
          f"the largest {r['peak_driver_rss_mb']:.0f} MB")
    return 0
