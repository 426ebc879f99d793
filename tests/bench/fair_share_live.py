"""Fair share, live: two tenants weighing 3 and 1, one identical tiny job each, on the engine's one
shared pair of worker groups (a torch rollout group and a torch train group).

    .venv/bin/python tests/bench/fair_share_live.py [--minutes 2.5] [--weights 3,1] [--shape train-heavy]
                                                    [--jobs 1] [--json]

Starts a local Ray and the engine service as the platform does (``EngineClient``) on a PLEXRL_HOME
of its own; ``tiny-arith`` is linked from ``--models`` when built there, else built with a short
supervised phase (about 20 s: a model that answers in form is all scheduling needs). Pushes each
tenant's weight (``set_tenant``), submits the two jobs at once (long enough never to finish),
lets them run ``--minutes``, cancels them, and prints, from the usage records of the window in
which both ran, each tenant's calls, device-seconds on each group and in all, and steps done, and
the ratio of the heavier tenant's device-seconds to the lighter's; also the seconds its calls
waited, ready, for a group (``queued_s``): where the groups are contended, the lighter tenant's.

Weights bind only under contention: where one job's call is ready and the other's is not, it runs
(the scheduler never idles a group for a tenant's share). Two identical jobs alternating between
the groups (``--shape balanced``: generate on one, minibatch updates on the other, about as long)
mostly interleave, and each gets what it asks for: a ratio near 1, the heavier tenant's calls
waiting less. ``--shape train-heavy`` (short answers, log-probs recomputed on the trainer) makes
both jobs want the train group most of the time: there the split leans to the weights.
``--jobs N`` gives each tenant N identical jobs (seeds differ), so each tenant nearly always has a
call ready for each group: a backlog, where the split should follow the weights.

A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TENANTS = ("gold", "plain")


SHAPES = {  # GRPO settings of each job, besides the common ones below
    "balanced": {"prompts_per_step": 16, "samples_per_prompt": 4, "max_tokens": 8},
    "train-heavy": {"prompts_per_step": 32, "samples_per_prompt": 8, "max_tokens": 4, "recompute_logprobs": True},
}


def job_spec(shape: str, seed: int = 0):
    from engine.spec import GRPOConfig, JobSpec

    grpo = GRPOConfig(updates_per_step=8, eval_every=100_000, eval_size=20, temperature=1.0, checkpoint_every=0,
                      **SHAPES[shape])
    return JobSpec(task="arith", model="tiny-arith", steps=100_000, seed=seed, rollout="torch", trainer="torch",
                   grpo=grpo)


def start_engine(models: Path):
    home = Path(tempfile.mkdtemp(prefix="plexrl-share-"))
    os.environ["PLEXRL_HOME"] = str(home)
    from engine.control import EngineClient
    from engine.models import is_model_dir
    from engine.spec import ServiceConfig

    if is_model_dir(models / "tiny-arith"):
        (home / "models").mkdir()
        (home / "models" / "tiny-arith").symlink_to((models / "tiny-arith").resolve())
    else:
        from engine.models.presets import TINY_ARITH
        from engine.models.tiny import build_preset

        build_preset(dataclasses.replace(TINY_ARITH, sft_steps=250, eval_size=50, threads=1),
                     home / "models" / "tiny-arith", progress=True)
    return EngineClient(data_dir=home, config=ServiceConfig(devices_per_group=1.0, threads=1)), home


def run(engine, weights: tuple[float, float], minutes: float, shape: str, jobs: int = 1) -> dict[str, list[dict]]:
    """Every tenant's jobs' events (merged), after running ``minutes`` side by side."""
    for tenant, weight in zip(TENANTS, weights, strict=True):
        engine.set_tenant(tenant, weight=weight, device_seconds=None)
    names = {t: [f"share-{t}-{n}" for n in range(jobs)] for t in TENANTS}
    for n in range(jobs):
        for tenant in reversed(TENANTS):  # the lighter tenant's first: ties between equal calls go its way
            engine.submit_job(names[tenant][n], job_spec(shape, seed=n), tenant=tenant)
    time.sleep(minutes * 60)
    events: dict[str, list[dict]] = {}
    for tenant in TENANTS:
        events[tenant] = []
        for job in names[tenant]:
            engine.cancel(job, reason="measured")
            after = 0
            while batch := engine.events(job, after, 10_000):
                events[tenant] += batch
                after = batch[-1]["seq"]
    return events


def table(events: dict[str, list[dict]], weights: tuple[float, float]) -> dict:
    """Per tenant, within the window both jobs ran (the later first call to the earlier last end)."""
    usage = {t: [e["data"] for e in events[t] if e["kind"] == "usage"] for t in TENANTS}
    lo = max(min(u["start"] for u in usage[t]) for t in TENANTS)
    hi = min(max(u["end"] for u in usage[t]) for t in TENANTS)
    rows = {}
    for tenant, weight in zip(TENANTS, weights, strict=True):
        inside = [u for u in usage[tenant] if u["start"] >= lo and u["end"] <= hi]
        by_group: dict[str, float] = defaultdict(float)
        for u in inside:
            by_group[u["wpg"]] += u["devices"] * (u["end"] - u["start"])
        steps = [e for e in events[tenant] if e["kind"] == "metrics" and lo <= e["ts"] <= hi]
        waited = sum({u["call"]: u["queued_s"] for u in inside}.values())  # a call on two groups: once
        rows[tenant] = {"weight": weight, "calls": len({u["call"] for u in inside}), "steps": len(steps),
                        "waited_s": waited, "by_group": dict(sorted(by_group.items())),
                        "device_s": sum(by_group.values())}
    heavy, light = rows[TENANTS[0]], rows[TENANTS[1]]
    groups = sorted(set(heavy["by_group"]) | set(light["by_group"]))
    return {"window_s": hi - lo, "tenants": rows,
            "ratio": heavy["device_s"] / light["device_s"],
            "ratio_by_group": {g: heavy["by_group"].get(g, 0.0) / light["by_group"][g] for g in groups
                               if light["by_group"].get(g)}}


def report(out: dict) -> None:
    groups = sorted(out["ratio_by_group"])
    print(f"window in which both jobs ran: {out['window_s']:.1f} s")
    print(f"{'tenant':8} {'weight':>6} {'steps':>5} {'calls':>6} {'waited s':>8} "
          + " ".join(f"{g + ' dev-s':>20}" for g in groups) + f" {'device-s':>9}")
    for tenant, row in out["tenants"].items():
        print(f"{tenant:8} {row['weight']:6g} {row['steps']:5d} {row['calls']:6d} {row['waited_s']:8.1f} "
              + " ".join(f"{row['by_group'].get(g, 0.0):20.2f}" for g in groups) + f" {row['device_s']:9.2f}")
    print(f"{'ratio':8} {'':6} {'':5} {'':6} {'':8} " + " ".join(f"{out['ratio_by_group'][g]:20.2f}" for g in groups)
          + f" {out['ratio']:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=2.5)
    parser.add_argument("--weights", default="3,1", help="the two tenants' weights (default 3,1)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="balanced", help="what each job runs")
    parser.add_argument("--models", type=Path,
                        default=Path(os.environ.get("PLEXRL_HOME", Path.home() / ".plexrl")) / "models")
    parser.add_argument("--jobs", type=int, default=1, help="identical jobs each tenant runs (default 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    weights = tuple(float(w) for w in args.weights.split(","))
    engine, home = start_engine(args.models)
    try:
        out = table(run(engine, weights, args.minutes, args.shape, args.jobs), weights)
    finally:
        engine.shutdown()
    print(f"shape {args.shape}, {args.jobs} job(s) a tenant; models in {home / 'models'}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        report(out)


if __name__ == "__main__":
    main()
