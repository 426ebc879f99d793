"""Run small real jobs alone, the way the engine service runs them, and keep what they measured.

Shared by ``estimate_calibrate.py`` (measures the cost model's constants) and
``estimate_accuracy.py`` (compares pre-run estimates with what the jobs were billed). Each job runs
on a rollout and a train worker group of its own (torch, one device slot and one torch thread per
group, as ``engine.spec.ServiceConfig``'s defaults), in a fresh temporary ``PLEXRL_HOME`` that
holds only links to the built model presets: no earlier profiles.

    python tests/bench/estimate_runs.py --out runs.json   # the calibration shapes, raw
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

PRESETS = ("tiny-arith", "tiny-arith-tools")


def fresh_home() -> Path:
    """A temporary ``PLEXRL_HOME`` with the built presets linked in, and nothing else; set in the
    environment (Ray's workers inherit it)."""
    home = Path(tempfile.mkdtemp(prefix="plexrl-estimate-"))
    (home / "models").mkdir()
    source = REPO / ".plexrl" / "models"
    for name in PRESETS:
        (home / "models" / name).symlink_to(source / name)
    os.environ["PLEXRL_HOME"] = str(home)
    return home


def run_alone(specs: dict[str, dict[str, Any]], home: Path) -> dict[str, dict[str, Any]]:
    """Run each job alone on a pair of groups of its own; for each: its spec, usage records,
    per-step metrics and wall seconds."""
    from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS
    from engine.service.eventlog import read_events
    from engine.service.runtime import EngineConfig, JobRun, LocalEngine, run_jobs
    from engine.spec import JobSpec

    os.environ["RAY_ADDRESS"] = "local"  # a Ray of our own, never a cluster someone else started here
    out: dict[str, dict[str, Any]] = {}
    config = EngineConfig(devices=2, threads_per_rank=1, num_cpus=2)
    with LocalEngine(config, data_dir=home) as engine:
        for name, raw in specs.items():
            spec = JobSpec.from_dict(raw)
            groups = [engine.start_group(f"{name}-{side}", "torch", devices_per_rank=1.0, threads=1, serves=serves)
                      for side, serves in (("rollout", ROLLOUT_FUNCTIONS), ("train", TRAIN_FUNCTIONS))]
            path = home / "jobs" / name / "events.jsonl"
            t0 = time.time()
            run_jobs([JobRun(name, spec, path)], groups, poll_s=0.05)
            events = read_events(path)
            out[name] = {"spec": spec.to_dict(), "wall_s": time.time() - t0,
                         "usage": [e["data"] for e in events if e["kind"] == "usage"],
                         "metrics": [e["data"] for e in events if e["kind"] == "metrics"],
                         "timings": [e["data"] for e in events if e["kind"] == "timings"]}
            for g in groups:
                g.shutdown()
                engine.groups.remove(g)
            print(f"{name}: {out[name]['wall_s']:.1f} s, {len(out[name]['usage'])} calls", file=sys.stderr)
    return out


def grpo(**kw: Any) -> dict[str, Any]:
    return kw


# The calibration shapes: small, and deliberately not the accuracy benchmark's shapes, with sizes
# that differ enough to separate each function's per-call cost from its per-unit cost.
CALIBRATION = {
    "cal-small": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 11, "rollout": "torch",
                  "trainer": "torch", "grpo": grpo(prompts_per_step=4, samples_per_prompt=4, updates_per_step=2,
                                                   eval_every=2, eval_size=50)},
    "cal-wide": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 12, "rollout": "torch",
                 "trainer": "torch", "grpo": grpo(prompts_per_step=32, samples_per_prompt=8, updates_per_step=2,
                                                  eval_every=4, eval_size=200)},
    "cal-passes": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 13, "rollout": "torch",
                   "trainer": "torch", "grpo": grpo(prompts_per_step=16, samples_per_prompt=4, updates_per_step=6,
                                                    eval_every=4, eval_size=20, kl_coef=0.05,
                                                    recompute_logprobs=True)},
    "cal-long": {"task": "arith", "model": "tiny-arith", "steps": 12, "seed": 15, "rollout": "torch",
                 "trainer": "torch", "grpo": grpo(prompts_per_step=4, samples_per_prompt=4, updates_per_step=1,
                                                  eval_every=6, eval_size=100)},
    "cal-tools": {"task": "arith-tools", "model": "tiny-arith-tools", "steps": 4, "seed": 14, "rollout": "torch",
                  "trainer": "torch", "tools": {"latency_median_s": 0.2, "latency_p99_s": 1.0, "max_calls": 2},
                  "grpo": grpo(prompts_per_step=16, samples_per_prompt=4, updates_per_step=2, eval_every=4,
                               eval_size=100)},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    home = fresh_home()
    runs = run_alone(CALIBRATION, home)
    args.out.write_text(json.dumps(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
