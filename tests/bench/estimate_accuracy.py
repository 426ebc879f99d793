"""How close the pre-run estimate comes to the bill: real jobs of each task and each pair of backends,
small and large, each estimated before it runs in a fresh ``PLEXRL_HOME`` (no profiles: the cost
model's basis), then run alone through the engine service as the platform runs it (on groups formed
for it: model loads and vLLM's engine start included) and billed from its usage records; both go
through the same savings function the platform bills with
(``engine.accounting.metering.savings_of_rows``). Prints a table and the JSON.

    python tests/bench/estimate_accuracy.py [--json out.json] [--profile-check]

``--profile-check`` also estimates each shape again after its run (basis "profile", from the
profile its driver wrote) to show the second estimate of a shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from estimate_runs import fresh_home, grpo, run_alone

from engine.accounting.estimate import estimate
from engine.accounting.metering import UsageRecord, record_rows, savings_of_rows

RESERVED = 2  # one rollout and one train device: the jobs' declared dedicated deployment
MODE = "async_split"  # the platform's default deployment mode

DATASET = "problems.jsonl"  # written into the benchmark's PLEXRL_HOME: 600 arithmetic problems


def _shape(task: str, steps: int, seed: int, rollout: str, trainer: str, **grpo_fields: Any) -> dict[str, Any]:
    model = "tiny-arith-tools" if task == "arith-tools" else "tiny-arith"
    return {"task": task, "model": model, "steps": steps, "seed": seed, "rollout": rollout, "trainer": trainer,
            "grpo": grpo(**grpo_fields)}


# Small and large jobs of each task on each pair of backends, none of them a calibration shape
# (``estimate_runs.CALIBRATION``). Defaults elsewhere: 8 samples a prompt, 8 updates a step, an
# evaluation of 500 problems every 10 steps, a checkpoint every 10.
SHAPES = {
    # the job of the report: submitted from the form with its defaults, 8 steps of 32 prompts
    "form-small": {"task": "arith", "model": "tiny-arith", "steps": 8, "seed": 0, "grpo": {"prompts_per_step": 32}},
    "arith-small": _shape("arith", 20, 0, "torch", "torch", prompts_per_step=8, samples_per_prompt=4),
    "arith-large": _shape("arith", 30, 1, "vllm", "megatron", prompts_per_step=64, samples_per_prompt=8),
    "train-heavy": _shape("arith", 10, 2, "torch", "megatron", prompts_per_step=16, samples_per_prompt=4,
                          updates_per_step=4, kl_coef=0.05, recompute_logprobs=True),
    "tools-small": _shape("arith-tools", 10, 3, "torch", "torch", prompts_per_step=8, samples_per_prompt=4),
    "tools-large": _shape("arith-tools", 20, 4, "vllm", "megatron", prompts_per_step=32, samples_per_prompt=8),
    "dataset": {**_shape("dataset", 12, 5, "vllm", "torch", prompts_per_step=16, eval_every=6), "dataset": DATASET},
}


def _write_dataset(home: Path) -> str:
    import numpy as np

    from engine.tasks.arithmetic import sample_problems

    path = home / DATASET
    problems = sample_problems(np.random.default_rng(7), 600)
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems))
    return str(path)


def _figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    s = savings_of_rows(rows, RESERVED, MODE)
    return {"multiplexed_device_hours": s["billed_device_hours"],
            "dedicated_device_hours": s["counterfactual_device_hours"], "wall_seconds": s["isolated_wall_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile-check", action="store_true")
    parser.add_argument("--only", nargs="+", choices=sorted(SHAPES), help="run only these shapes")
    args = parser.parse_args()
    home = fresh_home()
    shapes = {name: {**spec, "dataset": _write_dataset(home)} if "dataset" in spec else spec
              for name, spec in SHAPES.items()}
    if args.only:
        shapes = {name: shapes[name] for name in args.only}
    before = {name: estimate(spec, home=home) for name, spec in shapes.items()}
    runs = run_alone(shapes, home)
    results = []
    for name, run in runs.items():
        predicted = before[name]
        est = _figures(record_rows(predicted.usage_records()))
        billed = _figures(record_rows(UsageRecord.from_dict(u) for u in run["usage"]))
        spec = run["spec"]
        row = {"job": name, "task": spec["task"], "backends": f"{spec['rollout']}+{spec['trainer']}",
               "steps": spec["steps"], "basis": predicted.basis, "estimate": est, "billed": billed,
               "error_billed": est["multiplexed_device_hours"] / billed["multiplexed_device_hours"] - 1,
               "error_dedicated": est["dedicated_device_hours"] / billed["dedicated_device_hours"] - 1}
        if args.profile_check:
            again = estimate(shapes[name], home=home)
            row["profile_basis"] = again.basis
            row["profile_error_billed"] = (_figures(record_rows(again.usage_records()))["multiplexed_device_hours"]
                                           / billed["multiplexed_device_hours"] - 1)
        results.append(row)
    print(f"{'job':<12} {'task':<11} {'backends':<15} {'basis':<6} {'est dev-h':>10} {'billed dev-h':>12} "
          f"{'err':>7}   {'est dedicated':>13} {'dedicated':>10} {'err':>7}")
    for r in results:
        e, b = r["estimate"], r["billed"]
        print(f"{r['job']:<12} {r['task']:<11} {r['backends']:<15} {r['basis']:<6} "
              f"{e['multiplexed_device_hours']:>10.5f} "
              f"{b['multiplexed_device_hours']:>12.5f} {r['error_billed']:>+7.1%}   "
              f"{e['dedicated_device_hours']:>13.5f} {b['dedicated_device_hours']:>10.5f} "
              f"{r['error_dedicated']:>+7.1%}")
    out = {"home": str(home), "reserved_devices": RESERVED, "mode": MODE, "jobs": results}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
