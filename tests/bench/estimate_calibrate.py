"""Measure the pre-run estimate's cost-model constants on this machine and write them to
``engine/accounting/calibration.json`` (what ``engine.accounting.estimate`` ships).

    python tests/bench/estimate_calibrate.py                    # run the calibration jobs, fit, write
    python tests/bench/estimate_calibrate.py --runs runs.json   # fit again from runs kept earlier

It runs the small calibration jobs of ``estimate_runs.CALIBRATION`` alone (torch groups, one
device slot and one thread each, as the engine service runs them; a fresh ``PLEXRL_HOME``), then:

- task constants from the jobs' metrics: the mean train accuracy per task (the fraction of prompt
  groups kept for training follows from it, ``engine.accounting.estimate.kept_fraction``), tool calls per
  answer, and the per-turn call rate that gives them;
- per backend and function (the weight sync: per pair of backends), a least-squares fit of its
  measured seconds (usage records' end - start, all calls of the job together) against the plan's
  call count and units (``engine.accounting.estimate.plan``): ``seconds = warm_up + per_call x
  calls + per_unit x units`` (``warm_up``, once a run, only for the functions whose seconds grow with
  size: a fresh group's first batch costs more than the rest, vLLM's most), coefficients kept >= 0,
  over the runs in which that backend ran that function;
- the driver's host seconds between calls (span less held seconds less tool stalls) against one per
  job, steps and evaluated answers (``engine.accounting.estimate.host_terms``), coefficients kept >= 0.

The accuracy benchmark (``estimate_accuracy.py``) uses other shapes; nothing is fitted to it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from estimate_runs import CALIBRATION, fresh_home, run_alone

from engine.accounting.estimate import CALIBRATION_PATH, UNIT_FUNCTIONS, constants_scope, function_key, host_terms, plan
from engine.spec import JobSpec


def _rate_for(calls_per_answer: float, max_calls: int) -> float:
    """The per-turn call probability q with q + q^2 + ... + q^max_calls = calls_per_answer."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        q = (lo + hi) / 2
        lo, hi = (q, hi) if sum(q ** t for t in range(1, max_calls + 1)) < calls_per_answer else (lo, q)
    return (lo + hi) / 2


def task_constants(runs: dict[str, Any]) -> dict[str, dict[str, float]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for run in runs.values():
        by_task.setdefault(run["spec"]["task"], []).append(run)
    tasks: dict[str, dict[str, float]] = {}
    for task, task_runs in by_task.items():
        metrics = [m for r in task_runs for m in r["metrics"]]
        entry = {"accuracy": float(np.mean([m["train_accuracy"] for m in metrics]))}
        if "tool_calls" in metrics[0]:
            calls = float(np.mean([m["tool_calls"] for m in metrics]))
            max_calls = task_runs[0]["spec"]["tools"]["max_calls"]
            entry |= {"tool_calls_per_answer": calls, "tool_call_rate": _rate_for(calls, max_calls)}
        tasks[task] = entry
    tasks["default"] = {"accuracy": float(np.mean([t["accuracy"] for t in tasks.values()]))}
    return tasks


# a fitted entry: where it lives in the calibration (``constants_scope``) and its function key
Key = tuple[tuple[str, str], str]


def _measured(run: dict[str, Any], spec: JobSpec) -> tuple[dict[Key, float], float]:
    """Seconds per ``Key`` (a call on two groups once) and the host gap of one run.
    A group's side is in its name (``<backend>-<side>...``, the service's naming)."""
    sides: dict[int, list[str]] = {}
    for u in run["usage"]:
        sides.setdefault(u["call"], []).append(u["wpg"].split("-")[1])
    calls = {u["call"]: u for u in run["usage"]}
    seconds: dict[Key, float] = {}
    for call, u in calls.items():
        wpgs = tuple(sorted(set(sides[call])))  # ("rollout", "train") as the plan orders them
        key = (constants_scope(spec, wpgs), function_key(u["role"], u["fn"], wpgs))
        seconds[key] = seconds.get(key, 0.0) + u["end"] - u["start"]
    span = max(u["end"] for u in run["usage"]) - min(u["start"] for u in run["usage"])
    stall = sum(t.get("tool_stall", 0.0) for t in run["timings"])
    return seconds, max(0.0, span - sum(seconds.values()) - stall)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares of y on the columns of x with every coefficient >= 0 (a negative cost explains
    nothing): a column whose coefficient comes out negative is dropped and the rest refitted."""
    keep = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0] * x.shape[1]
            for i, c in zip(keep, coef, strict=True):
                out[i] = max(0.0, float(c))
            return out
        keep.pop(int(np.argmin(coef)))


def fit(runs: dict[str, Any]) -> dict[str, Any]:
    tasks = task_constants(runs)
    partial = {"tasks": tasks}
    rows: dict[Key, list[tuple[float, float, float]]] = {}  # (calls, units, seconds) per run
    host: list[tuple[float, ...]] = []  # (*host_terms, gap seconds)
    for run in runs.values():
        spec = JobSpec.from_dict(run["spec"])
        planned, _, _ = plan(spec, partial)
        seconds, gap = _measured(run, spec)
        totals: dict[Key, list[float]] = {}
        for c in planned:
            t = totals.setdefault((constants_scope(spec, c.wpgs), function_key(c.role, c.fn, c.wpgs)), [0.0, 0.0])
            t[0] += c.count
            t[1] += c.units
        for key, (count, units) in totals.items():
            rows.setdefault(key, []).append((count, units, seconds.get(key, 0.0)))
        host.append((*host_terms(spec), gap))
    scopes: dict[str, dict[str, dict[str, Any]]] = {"backends": {}, "pairs": {}}
    for ((section, name), key), data in sorted(rows.items()):
        a = np.array(data)
        if key in UNIT_FUNCTIONS:  # a job's first calls on a fresh group warm it up: an intercept per run
            warm_up, per_call, per_unit = _nonnegative_fit(np.column_stack([np.ones(len(a)), a[:, :2]]), a[:, 2])
            constants = {"warm_up": warm_up, "per_call": per_call, "per_unit": per_unit}
        else:
            constants = {"per_call": float(a[:, 2].sum() / a[:, 0].sum())}
        scopes[section].setdefault(name, {})[key] = constants
    h = np.array(host)
    host_fit = _nonnegative_fit(h[:, :-1], h[:, -1])
    return {
        "measured": {"at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": platform.machine(),
                     "python": platform.python_version(), "command": "python tests/bench/estimate_calibrate.py",
                     "jobs": {name: run["spec"] for name, run in runs.items()},
                     "groups": "a rollout and a train group formed for each job by the engine service "
                               "(1 device slot and 1 torch thread each)"},
        "units": {"generate": "sequences x max tokens per turn", "forward": "training rows",
                  "forward_backward": "training rows"},
        **scopes,
        "host": dict(zip(("per_job", "per_step", "per_eval_answer"), host_fit, strict=True)),
        "tasks": tasks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, help="fit from these measured runs (estimate_runs.py --out)")
    parser.add_argument("--keep-runs", type=Path, help="also write the measured runs here")
    parser.add_argument("--out", type=Path, default=CALIBRATION_PATH)
    args = parser.parse_args()
    if args.runs:
        runs = json.loads(args.runs.read_text())
    else:
        runs = run_alone(CALIBRATION, fresh_home())
        if args.keep_runs:
            args.keep_runs.write_text(json.dumps(runs))
    calibration = fit(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(calibration, indent=1) + "\n")
    print(json.dumps({k: calibration[k] for k in ("backends", "pairs", "host", "tasks")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
