"""Pre-run cost estimates: the calls a job will make, and how long each holds its worker group.

Called by ``EngineService.estimate`` and, in-process (a pure module: no Ray, no worker groups), by the
platform when a job is submitted; the platform bills the predicted calls with the same code that
bills measured usage, so an estimate and a bill mean the same thing.

The plan of a job follows ``engine.rl.grpo.train`` and the router call for call: one ``create`` per
deployment and group, a held-out evaluation at step 0, every ``eval_every`` steps and at the last
step, and per step one rollout (with a tool: one ``generate`` per turn that still has callers, and
the tool's stall between turns), the optional old-policy and reference ``forward`` passes,
``updates_per_step`` pairs of ``forward_backward`` and ``optim_step``, and a ``sync_weights``
holding both groups; a ``save_checkpoint`` every ``checkpoint_every`` steps and the final one (the
weights a job exports).

Each planned call has a size (its *units*: sequences x max tokens for ``generate``, training rows
for the passes); its seconds come from one of two bases:

- ``model``: ``warm_up + per_call x calls + per_unit x units`` with constants measured on this
  machine class for the backend that runs the call (the rollout side's for ``generate`` and the
  rollout copy's ``create``, the trainer's for the passes, the optimizer step, its ``create`` and the
  checkpoints, the pair's for ``sync_weights``), shipped in ``engine/accounting/calibration.json``
  (re-measure with ``python tests/bench/estimate_calibrate.py``). Start-up is in them: they are
  measured on groups formed for the job, so a ``create`` includes loading the model and, for vLLM,
  building its engine, and ``warm_up`` is what a fresh group's first calls take beyond the rest;
- ``profile``: the same plan, each function's seconds scaled by measured/predicted of a finished job
  with the same cost-relevant shape (``PLEXRL_HOME/profiles/<shape>.json``, written by the job's
  driver when it succeeds, from its usage records).

Between calls the driver works on the host (rewards, tokenizing) and waits on tools: those seconds
hold no group (nobody is billed for them) but a dedicated deployment holds its devices through them,
so they enter the wall time of the counterfactual.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

from engine.accounting.metering import UsageRecord
from engine.paths import plexrl_home
from engine.spec import JobSpec
from engine.support.atomic_json import write_json

CALIBRATION_PATH = Path(__file__).with_name("calibration.json")
PROFILE_VERSION = 1
ROLLOUT, TRAIN = "rollout", "train"
UNIT_FUNCTIONS = ("generate", "forward", "forward_backward")  # seconds grow with the call's size


@dataclass(frozen=True)
class PlannedCall:
    """``count`` calls of one kind, ``units`` their total size; ``wpgs``: the groups each holds."""

    role: str
    fn: str
    wpgs: tuple[str, ...]
    count: float
    units: float = 0.0
    seconds: float = 0.0  # all ``count`` calls together, per group held


@dataclass(frozen=True)
class Estimate:
    """A job's predicted run: its calls (in plan order), the host seconds between them, and where
    the seconds came from (``basis``: "profile" or "model")."""

    spec: JobSpec
    calls: tuple[PlannedCall, ...]
    gap_seconds: float  # the driver's host work and tool stalls: wall time no group is held
    basis: str

    @property
    def held_seconds(self) -> float:
        return sum(c.seconds for c in self.calls)

    @property
    def wall_seconds(self) -> float:
        return self.held_seconds + self.gap_seconds

    @property
    def step_seconds(self) -> float:
        return self.wall_seconds / self.spec.steps

    def usage_records(self, *, devices_per_group: float = 1.0, job: str = "estimate") -> list[UsageRecord]:
        """The predicted calls as usage records on a clock starting at 0, one after another with the
        host gaps spread evenly between them (calls of one kind merged into one record: billing
        only sums and spans them). A call holding two groups has a record on each, as metered."""
        records: list[UsageRecord] = []
        gap = self.gap_seconds / max(1, len(self.calls) - 1)  # between calls, none after the last
        clock = 0.0
        for i, c in enumerate(self.calls):
            for wpg in c.wpgs:
                records.append(UsageRecord(job=job, role=c.role, fn=c.fn, wpg=wpg, devices=devices_per_group,
                                           start=clock, end=clock + c.seconds, exec_s=c.seconds, call=i))
            clock += c.seconds + gap
        return records

    def to_dict(self) -> dict[str, Any]:
        return {"basis": self.basis, "wall_seconds": self.wall_seconds, "step_seconds": self.step_seconds,
                "held_seconds": self.held_seconds, "gap_seconds": self.gap_seconds,
                "calls": [dataclasses.asdict(c) for c in self.calls]}


# -- calibration ------------------------------------------------------------------------------------


def load_calibration(path: Path | None = None) -> dict[str, Any]:
    """The shipped constants (see ``tests/bench/estimate_calibrate.py`` for how they are measured)."""
    return json.loads((path or CALIBRATION_PATH).read_text())


def _task_constants(calibration: dict[str, Any], task: str) -> dict[str, float]:
    """What a task's data does to a step: how often a sampled answer is right (``accuracy``) and,
    with a tool, how often a turn ends in a call."""
    tasks = calibration["tasks"]
    return tasks.get(task, tasks["default"])


def kept_fraction(accuracy: float, samples_per_prompt: int) -> float:
    """The fraction of prompt groups GRPO trains on: those whose answers are neither all right nor all
    wrong (equal rewards give zero advantages), each answer right with probability ``accuracy``."""
    p, g = accuracy, samples_per_prompt
    return max(0.0, 1.0 - p ** g - (1.0 - p) ** g)


# -- the plan ---------------------------------------------------------------------------------------


def _checkpoints(spec: JobSpec) -> int:
    """Checkpoints saved: every ``checkpoint_every`` steps before the last, then the final one."""
    every = spec.grpo.checkpoint_every
    return 1 + ((spec.steps - 1) // every if every else 0)


def _evaluations(spec: JobSpec) -> int:
    """Held-out evaluations: one before training, then every ``eval_every`` steps and at the last."""
    every = spec.grpo.eval_every
    return 1 + spec.steps // every + (0 if spec.steps % every == 0 else 1)


def _eval_size(spec: JobSpec) -> int:
    """Problems a held-out evaluation answers: ``eval_size``, or fewer where a dataset job's held-out
    set is smaller (read from its files; unreadable ones count as ``eval_size``: the job will fail
    on them anyway)."""
    if spec.task != "dataset":
        return spec.grpo.eval_size
    return min(spec.grpo.eval_size, _held_out_size(spec.dataset, spec.eval_dataset))


def _file_version(path: str | None) -> tuple[str, int] | None:
    if path is None:
        return None
    try:
        return path, Path(path).stat().st_mtime_ns
    except OSError:
        return path, -1


def _held_out_size(dataset: str, eval_dataset: str | None) -> int:
    return _held_out_size_of(_file_version(dataset), _file_version(eval_dataset))


@functools.lru_cache(maxsize=64)  # by path and modification time: an estimate reads a dataset once
def _held_out_size_of(dataset: tuple[str, int], eval_dataset: tuple[str, int] | None) -> int:
    from engine.tasks.datasets import DatasetError, DatasetTask

    try:
        task = DatasetTask(Path(dataset[0]), Path(eval_dataset[0]) if eval_dataset else None)
    except (DatasetError, OSError):
        return 1 << 30
    return len(task.test)


def _max_tokens(spec: JobSpec) -> int:
    from engine.tasks.registry import TASKS

    return max(spec.grpo.max_tokens, getattr(TASKS[spec.task], "min_turn_tokens", 1))


def _rollout(sequences: float, spec: JobSpec, task: dict[str, float]) -> tuple[float, float, float]:
    """One rollout of ``sequences`` answers: (generate calls, their units, tool stall seconds).

    With a tool, each turn's answers call it with probability ``tool_call_rate`` (so turn t has
    sequences x rate^t callers) while calls are left; the driver waits for the slowest of a turn's
    calls (``expected_max``)."""
    tokens = _max_tokens(spec)
    calls, units, stall = 1.0, sequences * tokens, 0.0
    if not _uses_tools(spec):
        return calls, units, stall
    rate = task.get("tool_call_rate", 0.0)
    latency = spec.tools.latency
    live = sequences
    for _ in range(spec.tools.max_calls):
        live *= rate
        if live < 0.5:
            break
        if latency.median_s > 0:  # a median of 0 turns the wait off
            stall += expected_max(latency.median_s, latency.sigma, live)
        calls += 1
        units += live * tokens
    return calls, units, stall


def _expected_updates(prompts: int, kept: float, rows_per_group: float, updates: int) -> float:
    """Minibatches a step trains on: ``updates`` splits of its rows, an empty split making no call,
    so min(updates, rows); the kept groups K are binomial (``prompts``, ``kept``), and a step without
    one trains nothing. The binomial in log space: thousands of prompts must not underflow."""
    if kept <= 0.0:
        return 0.0
    if kept >= 1.0:
        return float(min(updates, prompts * rows_per_group))
    log_f, log_q, n = math.log(kept), math.log1p(-kept), prompts
    total = 0.0
    for k in range(n + 1):
        log_p = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_f + (n - k) * log_q
        total += math.exp(log_p) * min(updates, k * rows_per_group)
    return total


def expected_max(median_s: float, sigma: float, n: float, points: int = 400) -> float:
    """The mean of the largest of ``n`` log-normal latencies (median, sigma): the integral of the
    quantile function against the density of the maximum, n u^(n-1), by the midpoint rule."""
    if median_s <= 0 or n <= 0:
        return 0.0
    normal = NormalDist()
    total = 0.0
    for i in range(points):
        u = (i + 0.5) / points
        total += math.exp(sigma * normal.inv_cdf(u)) * n * u ** (n - 1)
    return median_s * total / points


def _uses_tools(spec: JobSpec) -> bool:
    from engine.tasks.registry import TASKS

    return TASKS[spec.task].uses_tools


def plan(spec: JobSpec, calibration: dict[str, Any]) -> tuple[list[PlannedCall], float, float]:
    """The job's calls (sizes, no seconds yet), its tool stall seconds and its training rows per step."""
    g = spec.grpo
    task = _task_constants(calibration, spec.task)
    samples = g.prompts_per_step * g.samples_per_prompt
    turns = 1.0 + (task.get("tool_calls_per_answer", 0.0) if _uses_tools(spec) else 0.0)
    # one training row per turn of each answer of a kept group
    rows = kept_fraction(task["accuracy"], g.samples_per_prompt) * samples * turns
    gen_calls, gen_units, stall = _rollout(samples, spec, task)
    eval_calls, eval_units, eval_stall = _rollout(_eval_size(spec), spec, task)
    evals, steps = _evaluations(spec), spec.steps
    both = (ROLLOUT, TRAIN)
    calls = [PlannedCall("policy", "create", (TRAIN,), 1), PlannedCall("policy", "create", (ROLLOUT,), 1)]
    if g.kl_coef > 0:
        calls.append(PlannedCall("reference", "create", (TRAIN,), 1))
    calls.append(PlannedCall("policy", "generate", (ROLLOUT,), steps * gen_calls + evals * eval_calls,
                             steps * gen_units + evals * eval_units))
    if g.recompute_logprobs:
        calls.append(PlannedCall("policy", "forward", (TRAIN,), steps, steps * rows))
    if g.kl_coef > 0:
        calls.append(PlannedCall("reference", "forward", (TRAIN,), steps, steps * rows))
    updates = steps * _expected_updates(g.prompts_per_step, kept_fraction(task["accuracy"], g.samples_per_prompt),
                                        g.samples_per_prompt * turns, g.updates_per_step)
    calls += [PlannedCall("policy", "forward_backward", (TRAIN,), updates, steps * rows),
              PlannedCall("policy", "optim_step", (TRAIN,), updates),
              PlannedCall("policy", "sync_weights", both, steps),
              PlannedCall("policy", "save_checkpoint", (TRAIN,), _checkpoints(spec))]
    return calls, steps * stall + evals * eval_stall, rows


def function_key(role: str, fn: str, wpgs: tuple[str, ...]) -> str:
    """A call's entry in a backend's calibration: its function, a ``create`` by what it makes (the
    trainer's policy, the rollout copy, the reference: they load different things)."""
    if fn != "create":
        return fn
    if role == "reference":
        return "create_reference"
    return "create_rollout" if wpgs == (ROLLOUT,) else "create"


def pair_key(rollout: str, trainer: str) -> str:
    return f"{rollout}+{trainer}"


def constants_scope(spec: JobSpec, wpgs: tuple[str, ...]) -> tuple[str, str]:
    """Where the calibration keeps the constants of a call on ``wpgs``: a call holding both groups
    (the weight sync) under the pair's entry, ``("pairs", "vllm+megatron")``, else under the backend
    of the side it runs on, ``("backends", "vllm")``."""
    if len(wpgs) > 1:
        return "pairs", pair_key(spec.rollout, spec.trainer)
    return "backends", spec.rollout if wpgs == (ROLLOUT,) else spec.trainer


def call_constants(spec: JobSpec, call: PlannedCall, calibration: dict[str, Any]) -> dict[str, float]:
    """The constants of ``call`` in ``spec``'s backends (``constants_scope``)."""
    section, name = constants_scope(spec, call.wpgs)
    return calibration[section][name][function_key(call.role, call.fn, call.wpgs)]


def _model_seconds(spec: JobSpec, call: PlannedCall, calibration: dict[str, Any]) -> float:
    """``warm_up`` (once a job: what a fresh group's first calls of the function take beyond the
    rest, e.g. vLLM's first batch) + ``per_call`` x calls + ``per_unit`` x units."""
    c = call_constants(spec, call, calibration)
    if call.count <= 0:
        return 0.0
    return c.get("warm_up", 0.0) + c["per_call"] * call.count + c.get("per_unit", 0.0) * call.units


def host_terms(spec: JobSpec) -> tuple[float, float, float]:
    """What the driver's host work between calls grows with: (one per job: loading the tokenizer and
    the evaluation set; steps; answers evaluated, each scored on the host)."""
    return 1.0, float(spec.steps), float(_evaluations(spec) * _eval_size(spec))


def _model_gap(spec: JobSpec, calibration: dict[str, Any]) -> float:
    """The driver's host seconds between calls (rewards, tokenizing, evaluation scoring)."""
    h = calibration["host"]
    per_job, steps, answers = host_terms(spec)
    return h["per_job"] * per_job + h["per_step"] * steps + h["per_eval_answer"] * answers


def model_estimate(spec: JobSpec, calibration: dict[str, Any] | None = None) -> Estimate:
    """The cost model's estimate (basis "model")."""
    calibration = calibration or load_calibration()
    calls, stall, _ = plan(spec, calibration)
    timed = tuple(dataclasses.replace(c, seconds=_model_seconds(spec, c, calibration)) for c in calls)
    return Estimate(spec, timed, stall + _model_gap(spec, calibration), "model")


# -- profiles ---------------------------------------------------------------------------------------

# What decides a job's cost; not its seed, its steps (the plan scales with them) or its learning rate.
_SHAPE_FIELDS = ("task", "model", "rollout", "trainer", "tp", "tools", "dataset")
_SHAPE_GRPO = ("prompts_per_step", "samples_per_prompt", "updates_per_step", "max_tokens", "eval_every",
               "eval_size", "recompute_logprobs")


def shape_key(spec: JobSpec) -> str:
    """The cost-relevant shape of a job, as a short stable digest (a profile's file name)."""
    d = spec.to_dict()
    shape = {f: d[f] for f in _SHAPE_FIELDS}
    shape["grpo"] = {f: d["grpo"][f] for f in _SHAPE_GRPO}
    shape["grpo"]["reference"] = spec.grpo.kl_coef > 0
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:20]


def profiles_dir(home: Path | None = None) -> Path:
    return Path(home or plexrl_home()) / "profiles"


def _fn_key(role: str, fn: str) -> str:
    return f"{role}/{fn}"


def _by_function(calls: Iterable[PlannedCall]) -> dict[str, float]:
    """Seconds per ``role/fn`` (a call holding two groups once, as billing's wall time counts it)."""
    out: dict[str, float] = {}
    for c in calls:
        out[_fn_key(c.role, c.fn)] = out.get(_fn_key(c.role, c.fn), 0.0) + c.seconds
    return out


def write_profile(spec: JobSpec, usage: Iterable[dict[str, Any]], *, home: Path | None = None,
                  calibration: dict[str, Any] | None = None) -> Path | None:
    """Store a finished job's measured seconds per function beside what the cost model predicted for
    it, under its shape; later estimates of that shape scale the model by measured/predicted.

    Called by the job's driver when the job succeeds, with its usage records (dicts, as logged).
    Returns the profile's path, or None when the job made no calls."""
    records = [UsageRecord.from_dict(u) if isinstance(u, dict) else u for u in usage]
    if not records:
        return None
    calibration = calibration or load_calibration()
    predicted = model_estimate(spec, calibration)
    calls = {r.call: r for r in records}  # a call held by two groups counts its seconds once
    measured: dict[str, float] = {}
    for r in calls.values():
        measured[_fn_key(r.role, r.fn)] = measured.get(_fn_key(r.role, r.fn), 0.0) + r.seconds
    span = max(r.end for r in records) - min(r.start - r.queued_s for r in records)
    shared = sum(r.queued_s + r.setup_s for r in calls.values())  # what sharing added, not the job's own
    gap = max(0.0, span - shared - sum(measured.values()))
    profile = {
        "version": PROFILE_VERSION, "shape": shape_key(spec), "spec": spec.to_dict(),
        "measured_seconds": measured,
        "predicted_seconds": _by_function(predicted.calls),
        "measured_gap_seconds": gap, "predicted_gap_seconds": predicted.gap_seconds,
    }
    return write_json(profiles_dir(home) / f"{profile['shape']}.json", profile, indent=1)  # never half a profile


def read_profile(spec: JobSpec, *, home: Path | None = None) -> dict[str, Any] | None:
    """The stored profile of ``spec``'s shape, or None (none yet, or unreadable)."""
    path = profiles_dir(home) / f"{shape_key(spec)}.json"
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return profile if profile.get("version") == PROFILE_VERSION else None


def _ratio(measured: float | None, predicted: float | None) -> float:
    if measured is None or not predicted:
        return 1.0
    return measured / predicted


def estimate(spec: JobSpec | dict[str, Any], *, home: Path | None = None,
             calibration: dict[str, Any] | None = None) -> Estimate:
    """A job's estimate: from a profile of its shape when one exists, else from the cost model.
    ``spec`` as a JobSpec or its dict (validated: ``SpecError`` names a bad field)."""
    spec = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
    calibration = calibration or load_calibration()
    modelled = model_estimate(spec, calibration)
    profile = read_profile(spec, home=home)
    if profile is None:
        return modelled
    measured, predicted = profile["measured_seconds"], profile["predicted_seconds"]
    calls = tuple(dataclasses.replace(c, seconds=c.seconds * _ratio(measured.get(_fn_key(c.role, c.fn)),
                                                                       predicted.get(_fn_key(c.role, c.fn))))
                  for c in modelled.calls)
    gap = modelled.gap_seconds * _ratio(profile["measured_gap_seconds"], profile["predicted_gap_seconds"])
    return Estimate(spec, calls, gap, "profile")
