"""How close the pre-run estimate comes to the bill: small real jobs, each estimated before it runs in a
fresh ``PLEXRL_HOME`` (no profiles: the cost model's basis), then run alone and billed from its usage
records; both go through the same savings function the platform bills with
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

# The shapes the issue names: arith 20 steps 8 prompts x 4 samples; arith-tools 10 steps with its
# tool stalls; a training-heavy one (updates_per_step 4, with KL to a reference and recomputed
# old-policy log-probs). Defaults elsewhere (evaluation of 500 problems every 10 steps).
SHAPES = {
    "arith": {"task": "arith", "model": "tiny-arith", "steps": 20, "seed": 0, "rollout": "torch", "trainer": "torch",
              "grpo": grpo(prompts_per_step=8, samples_per_prompt=4)},
    "arith-tools": {"task": "arith-tools", "model": "tiny-arith-tools", "steps": 10, "seed": 3, "rollout": "torch",
                    "trainer": "torch", "grpo": grpo(prompts_per_step=8, samples_per_prompt=4)},
    "train-heavy": {"task": "arith", "model": "tiny-arith", "steps": 10, "seed": 2, "rollout": "torch",
                    "trainer": "torch", "grpo": grpo(prompts_per_step=16, samples_per_prompt=4, updates_per_step=4,
                                                     kl_coef=0.05, recompute_logprobs=True)},
}


def _figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    s = savings_of_rows(rows, RESERVED, MODE)
    return {"multiplexed_device_hours": s["billed_device_hours"],
            "dedicated_device_hours": s["counterfactual_device_hours"], "wall_seconds": s["isolated_wall_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile-check", action="store_true")
    args = parser.parse_args()
    home = fresh_home()
    before = {name: estimate(spec, home=home) for name, spec in SHAPES.items()}
    runs = run_alone(SHAPES, home)
    results = []
    for name, run in runs.items():
        predicted = before[name]
        est = _figures(record_rows(predicted.usage_records()))
        billed = _figures(record_rows(UsageRecord.from_dict(u) for u in run["usage"]))
        row = {"job": name, "basis": predicted.basis, "estimate": est, "billed": billed,
               "error_billed": est["multiplexed_device_hours"] / billed["multiplexed_device_hours"] - 1,
               "error_dedicated": est["dedicated_device_hours"] / billed["dedicated_device_hours"] - 1}
        if args.profile_check:
            again = estimate(SHAPES[name], home=home)
            row["profile_basis"] = again.basis
            row["profile_error_billed"] = (_figures(record_rows(again.usage_records()))["multiplexed_device_hours"]
                                           / billed["multiplexed_device_hours"] - 1)
        results.append(row)
    print(f"{'job':<12} {'basis':<6} {'est dev-h':>10} {'billed dev-h':>12} {'err':>7}   "
          f"{'est dedicated':>13} {'dedicated':>10} {'err':>7}")
    for r in results:
        e, b = r["estimate"], r["billed"]
        print(f"{r['job']:<12} {r['basis']:<6} {e['multiplexed_device_hours']:>10.5f} "
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
