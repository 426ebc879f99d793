"""What a vLLM rollout group costs to serve jobs of two model configurations: a group of each (the
engine's placement, ``rollout_affinity``) or one group that rebuilds its engine whenever the next
job's model has another configuration.

    python tests/bench/rollout_affinity.py [--repeats 3] [--calls 8]

A vLLM engine is built for one model configuration. Rebuilding it for another costs its construction
(``engine_start_s``: import, weights, KV cache, warm-up), at every switch between the two. A group
of its own costs that once, and holds a device slot while it lives. A switch between jobs of one
configuration on a group (the StateManager swapping their weights) costs the call's ``setup_s``.
The script starts vLLM groups for a tiny Llama and a tiny Qwen3 ``--repeats`` times each and reads
each engine's construction time. On one group with one resident deployment it then alternates
``--calls`` greedy ``generate`` calls between two Llama jobs and reads each call's ``setup_s``. It
prints the medians and their ratio as JSON. A benchmark: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=8)
    args = parser.parse_args()

    import ray

    from engine.api import Request, SamplingParams
    from engine.service.runtime import EngineConfig, start_ray
    from engine.workers.group import Swapping, WorkerGroup
    from tests.modelfiles import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="rollout-affinity-"))
    models = {name: build_tiny_model(work / name, arch, seed=seed)
              for name, arch, seed in (("llama-a", "llama", 0), ("llama-b", "llama", 1), ("qwen3", "qwen3", 2))}
    start_ray(EngineConfig(devices=2))

    def engine_start(model: str, run: int) -> float:
        group = WorkerGroup.start(f"aff-{model}-{run}", "vllm", threads=1, data_dir=work, devices_per_rank=1.0)
        try:
            group.create((f"start-{run}", "policy"), models[model], trainable=False, optimizer=None)
            return ray.get(group.ranks[0].__ray_call__.remote(lambda rank: rank.backend.engine_start_s))
        finally:
            group.shutdown()

    starts = {model: [engine_start(model, run) for run in range(args.repeats)] for model in ("llama-a", "qwen3")}

    group = WorkerGroup.start("aff-swap", "vllm", threads=1, data_dir=work, devices_per_rank=1.0,
                              swapping=Swapping(max_resident=1))
    try:
        jobs = [(f"job-{i}", "policy") for i in range(2)]
        for job, model in zip(jobs, ("llama-a", "llama-b"), strict=True):
            group.create(job, models[model], trainable=False, optimizer=None)
        payload = {"prompts": [[3, 4, 5], [6, 7]], "sampling": SamplingParams(n=1, temperature=0.0, max_tokens=4)}
        setups = []
        for call in range(args.calls + 2):
            job = jobs[call % 2]
            _, timing = ray.get(group.ranks[0].run.remote(Request(*job, "generate", payload)))
            if call >= 2:  # the first two bring each job's state in for the first time
                setups.append(timing["setup_s"])
    finally:
        group.shutdown()

    rebuild = statistics.median(starts["qwen3"])
    switch = statistics.median(setups)
    print(json.dumps({
        "engine_start_s": {model: [round(s, 3) for s in values] for model, values in starts.items()},
        "engine_start_median_s": {model: round(statistics.median(v), 3) for model, v in starts.items()},
        "same_config_switch_setup_s": [round(s, 4) for s in setups],
        "same_config_switch_median_s": round(switch, 4),
        "rebuild_over_switch": round(rebuild / switch, 1) if switch > 0 else None,
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
