"""Run small real jobs alone, the way the platform runs them, and keep what they measured.

Shared by ``estimate_calibrate.py`` (measures the cost model's constants) and
``estimate_accuracy.py`` (compares pre-run estimates with what the jobs were billed). Each job is
submitted to the engine service (``EngineClient``, as the platform submits it; the service's default
config: one device slot and one torch thread per group) and runs alone on groups formed for it and
released when it ends (``idle_release_s=0``): every job pays its groups' model loads and, on vLLM,
its engine's start, as the first job of its shape on a quiet platform does. A fresh temporary
``PLEXRL_HOME`` holds only links to the built model presets (and the benchmark's datasets): no
earlier profiles.

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
    source = Path(os.environ.get("PLEXRL_MODELS", REPO / ".plexrl" / "models"))
    for name in PRESETS:
        (home / "models" / name).symlink_to(source / name)
    os.environ["PLEXRL_HOME"] = str(home)
    return home


def run_alone(specs: dict[str, dict[str, Any]], home: Path) -> dict[str, dict[str, Any]]:
    """Run each job alone through the engine service; for each: its spec (as the service resolved
    it: backends filled in), usage records, per-step metrics and timings, and wall seconds."""
    from engine.control import EngineClient
    from engine.service.eventlog import TERMINAL_STATES
    from engine.spec import JobSpec, ServiceConfig
    from engine.support.progress import is_tty, progress_bar

    os.environ.pop("RAY_ADDRESS", None)  # a Ray of our own, never a cluster someone else started here
    out: dict[str, dict[str, Any]] = {}
    engine = EngineClient(data_dir=home, config=ServiceConfig(idle_release_s=0.0))
    bar = progress_bar(total=len(specs), desc="jobs", unit="job", enabled=is_tty())
    try:
        for name, raw in specs.items():
            spec = JobSpec.from_dict(raw).to_dict()
            t0 = time.time()
            engine.submit_job(name, spec)
            while (state := engine.status(name)["state"]) not in TERMINAL_STATES:
                time.sleep(0.2)
            events, after = [], 0
            while batch := engine.events(name, after, 10_000):
                events += batch
                after = batch[-1]["seq"]
            if state != "succeeded":
                raise RuntimeError(f"{name} ended {state}: {events[-1]['data']}")
            out[name] = {"spec": spec, "wall_s": time.time() - t0,
                         "usage": [e["data"] for e in events if e["kind"] == "usage"],
                         "metrics": [e["data"] for e in events if e["kind"] == "metrics"],
                         "timings": [e["data"] for e in events if e["kind"] == "timings"]}
            bar.update()
            bar.write(f"{name} ({spec['rollout']}+{spec['trainer']}): {out[name]['wall_s']:.1f} s, "
                      f"{len(out[name]['usage'])} usage records", file=sys.stderr)
    finally:
        bar.close()
        engine.shutdown()
    return out


def grpo(**kw: Any) -> dict[str, Any]:
    return kw


# The calibration shapes: small, and deliberately not the accuracy benchmark's shapes, with sizes
# that differ enough to separate each function's per-call cost from its per-unit cost. Each runs on
# torch groups; the vLLM rollout and the Megatron trainer run the ones that separate their own
# functions' costs; every pair of backends runs at least one (its weight sync is the pair's).
_BASE = {
    "small": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 11,
              "grpo": grpo(prompts_per_step=4, samples_per_prompt=4, updates_per_step=2, eval_every=2, eval_size=50)},
    "wide": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 12,
             "grpo": grpo(prompts_per_step=32, samples_per_prompt=8, updates_per_step=2, eval_every=4,
                          eval_size=200)},
    "passes": {"task": "arith", "model": "tiny-arith", "steps": 4, "seed": 13,
               "grpo": grpo(prompts_per_step=16, samples_per_prompt=4, updates_per_step=6, eval_every=4, eval_size=20,
                            kl_coef=0.05, recompute_logprobs=True)},
    "long": {"task": "arith", "model": "tiny-arith", "steps": 12, "seed": 15,
             "grpo": grpo(prompts_per_step=4, samples_per_prompt=4, updates_per_step=1, eval_every=6, eval_size=100)},
    "tools": {"task": "arith-tools", "model": "tiny-arith-tools", "steps": 4, "seed": 14,
              "tools": {"latency_median_s": 0.2, "latency_p99_s": 1.0, "max_calls": 2},
              "grpo": grpo(prompts_per_step=16, samples_per_prompt=4, updates_per_step=2, eval_every=4,
                           eval_size=100)},
}
_PAIRS = {("torch", "torch"): ("small", "wide", "passes", "long", "tools"),
          ("vllm", "megatron"): ("small", "wide", "passes", "long", "tools"),
          ("vllm", "torch"): ("small",),
          ("torch", "megatron"): ("small",)}
CALIBRATION = {f"cal-{base}-{rollout}-{trainer}": {**_BASE[base], "rollout": rollout, "trainer": trainer}
               for (rollout, trainer), bases in _PAIRS.items() for base in bases}


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
