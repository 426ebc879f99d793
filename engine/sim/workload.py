"""Workloads for the simulator: RLVR jobs whose steps are sequences of phases with drawn durations.

A job (``Job``) has an arrival time, a model class (size, the rollout + train devices it reserves
under a split deployment, its isolated synchronous step time), a step count and a seed. Each step
is the phase sequence of an RLVR step:

    rollout (on the rollout devices, one call per inference replica)
    -> reward / verification (on CPU: devices idle) and tool stalls (agentic presets)
    -> log-prob passes (old policy, reference) on the training devices
    -> training on the training devices
    -> weight sync (training devices into the rollout devices: both sides)

Every phase's duration is drawn per step, seeded by (workload seed, job, step), so every deployment
mode the simulator compares sees exactly the same draws (``StepPlan``).

The rollout's long tail (``RolloutModel``). A step samples ``samples_per_step`` responses whose
lengths are log-normal (median, sigma, capped), split evenly over the job's inference replicas.
A replica decodes with ``batch_slots`` sequences at a time (continuous batching, memory-bound decode:
every decode step takes the same time whatever the occupancy), so its busy time in decode steps is
that of list-scheduling its responses on ``batch_slots`` slots, which we take at Graham's bound:
``sum(lengths) / slots + (1 - 1 / slots) * max(length)``. The phase ends when the slowest replica
ends; a replica that finishes early idles until then on a dedicated deployment. Decode steps are
scaled to seconds so that the mean rollout phase equals the class's rollout share of its isolated
step time (``Workload.shares``). The sum and the maximum of a replica's lengths are drawn directly
(the sum from the normal approximation of a sum of capped log-normals, the maximum by inverting
the distribution of the maximum), so a step costs O(replicas) however many responses it samples.

Colocated deployments run inference on the training layout: one group of rollout + train devices,
inference replicas as large as the training model-parallel group (``ModelClass.train_mp``), whose
per-device decode throughput is ``colocated_efficiency`` of a right-sized replica's. Larger replicas
each take more responses, so their tails are longer too; both losses are in the draws
(``StepPlan.colocated_rollout_s``).

The work floor of a job: the device-seconds of its phases on right-sized groups with no switch
cost -- every rollout replica billed its own busy time, log-prob and training passes on the train
devices, the weight sync on both sides -- computed from the draws, not from any run.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

_NORMAL = NormalDist()
_inv_cdf = np.vectorize(_NORMAL.inv_cdf, otypes=[float])


@dataclass(frozen=True)
class ModelClass:
    name: str
    params_b: float  # billions of parameters
    fraction: float  # of the workload's jobs
    rollout_gpus: int  # reserved under a split deployment
    train_gpus: int
    step_s: float  # isolated synchronous step time on its split reservation
    replica_gpus: int  # one inference replica (tensor-parallel size) on a right-sized rollout group
    train_mp: int  # model-parallel devices of the training layout (tensor x pipeline)


@dataclass(frozen=True)
class Shares:
    """Phases' shares of the isolated synchronous step (sum to 1)."""

    rollout: float = 0.55
    reward: float = 0.05  # on CPU: devices idle
    logprob: float = 0.12
    train: float = 0.25
    sync: float = 0.03


@dataclass(frozen=True)
class Workload:
    name: str
    classes: tuple[ModelClass, ...]
    shares: Shares = field(default_factory=Shares)
    gpus: int = 2048
    node_gpus: int = 8
    group_nodes: int = 8  # a node group: the unit a shared pool is carved from
    h2d_gb_s: float = 25.0  # host <-> device swap bandwidth per GPU
    disk_gb_s: float = 5.0  # disk -> host per node
    # the shared modes' swaps run at this fraction of h2d_gb_s: the StateManager's swap-in against a
    # plain copy of the same bytes, measured by `plexrl bench state` (192 MB of tensors: 0.87)
    swap_efficiency: float = 0.87
    gpu_memory_gb: float = 80.0
    weight_bytes: float = 2.0  # per parameter (bf16)
    optimizer_bytes: float = 12.0  # per parameter, sharded over the train group
    length_median: float = 1500.0  # response tokens
    length_sigma: float = 1.0
    length_cap: int = 16384
    samples_per_step: int = 8192  # prompts x samples per prompt
    batch_slots: int = 256  # sequences a replica decodes at once
    colocated_efficiency: float = 0.6  # per-device decode throughput on the training layout
    tp_latency_exponent: float = 0.5  # per-token latency of a k-times larger replica: k ** -exponent
    phase_cv: float = 0.05  # spread of the non-rollout phases around their shares
    tool_stall_s: float = 0.0  # per step: mean seconds the rollout waits on tool calls (devices idle)
    tool_stall_sigma: float = 0.0  # log-normal spread of that stall
    steps_min: int = 100
    steps_max: int = 400
    load: float = 0.8  # offered load of the isolated split deployment, as a fraction of the cluster
    arrivals_per_s: float | None = None  # a fixed Poisson arrival rate instead of the one ``load`` implies

    def __post_init__(self):
        total = sum(c.fraction for c in self.classes)
        if not self.classes or abs(total - 1.0) > 1e-9:
            raise ValueError(f"workload {self.name!r}: class fractions must sum to 1, got {total}")
        s = asdict(self.shares)
        if abs(sum(s.values()) - 1.0) > 1e-9 or min(s.values()) < 0:
            raise ValueError(f"workload {self.name!r}: phase shares must be >= 0 and sum to 1, got {s}")
        if not 0 < self.swap_efficiency <= 1:
            raise ValueError(f"swap_efficiency must be in (0, 1], got {self.swap_efficiency}")
        if self.gpus % (self.node_gpus * self.group_nodes):
            raise ValueError(f"--gpus must be a multiple of a node group ({self.group_gpus} GPUs), got {self.gpus}")
        for c in self.classes:
            if c.rollout_gpus % c.replica_gpus or (c.rollout_gpus + c.train_gpus) % c.train_mp:
                raise ValueError(f"class {c.name!r}: replicas and the training layout must divide its devices")

    @property
    def group_gpus(self) -> int:
        return self.node_gpus * self.group_nodes

    def by_name(self, name: str) -> ModelClass:
        return next(c for c in self.classes if c.name == name)

    def params(self) -> dict[str, Any]:
        return asdict(self)


def _paper_classes() -> tuple[ModelClass, ...]:
    # docs/workloads.md, "The paper-math preset": fraction, reservation and step time as written. The
    # replica and training-layout sizes are ours (the page does not give them): common tensor-parallel
    # sizes for these models.
    return (
        ModelClass("7B", 7.0, 0.40, 8, 8, 300.0, replica_gpus=1, train_mp=4),
        ModelClass("32B", 32.0, 0.30, 16, 16, 450.0, replica_gpus=2, train_mp=8),
        ModelClass("72B", 72.0, 0.20, 32, 32, 600.0, replica_gpus=4, train_mp=16),
        ModelClass("235B-A22B", 235.0, 0.10, 64, 64, 800.0, replica_gpus=8, train_mp=32),
    )


PRESETS: dict[str, Workload] = {
    # exactly docs/workloads.md's paper-math (do not tune: add a preset instead)
    "paper-math": Workload("paper-math", _paper_classes()),
    # multi-turn tool use: generation is the smaller part and tool calls stall it (ReTool: tool time
    # ~10x generation; verl fully-async: multi-turn ReTool rollout 61 % of a 375 s step)
    "agentic-tools": Workload("agentic-tools", _paper_classes(),
                              shares=Shares(rollout=0.61, reward=0.04, logprob=0.10, train=0.22, sync=0.03),
                              length_median=600.0, length_sigma=1.0, length_cap=8192, tool_stall_s=120.0,
                              tool_stall_sigma=0.8),
    # exactly docs/workloads.md's paper-math-backlog: paper-math with its 1,000 jobs arriving over the
    # first 24 hours, so every deployment carries a backlog and total completion measures capacity
    "paper-math-backlog": Workload("paper-math-backlog", _paper_classes(), arrivals_per_s=1000 / 86400),
    # long chain-of-thought: rollout up to 90 % of the step, 28K responses (verl DAPO recipe)
    "long-cot": Workload("long-cot", _paper_classes(),
                         shares=Shares(rollout=0.80, reward=0.02, logprob=0.06, train=0.10, sync=0.02),
                         length_median=4000.0, length_sigma=1.1, length_cap=28672),
}


@dataclass(frozen=True)
class Job:
    id: str
    cls: str  # ModelClass name
    arrival: float
    steps: int
    seed: int


# --- the rollout's long tail ------------------------------------------------------------------------


def _capped_lognormal_moments(median: float, sigma: float, cap: float) -> tuple[float, float]:
    """Mean and variance of min(L, cap), L log-normal with that median and sigma."""
    mu = math.log(median)
    z = (math.log(cap) - mu) / sigma
    above = 1.0 - _NORMAL.cdf(z)
    m1 = math.exp(mu + sigma**2 / 2) * _NORMAL.cdf(z - sigma) + cap * above
    m2 = math.exp(2 * mu + 2 * sigma**2) * _NORMAL.cdf(z - 2 * sigma) + cap**2 * above
    return m1, max(0.0, m2 - m1**2)


@dataclass(frozen=True)
class RolloutModel:
    median: float
    sigma: float
    cap: float
    slots: int

    def replica_steps(self, rng: np.random.Generator, samples: int, shape: tuple[int, ...]) -> np.ndarray:
        """Decode steps of replicas that each get ``samples`` responses (Graham's bound of
        list-scheduling them on ``slots``), an array of ``shape``."""
        bulk, tail = self.replica_parts(rng, samples, shape)
        return bulk + tail

    def replica_parts(self, rng: np.random.Generator, samples: int,
                      shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The two terms of ``replica_steps``: the throughput-bound bulk (all slots busy) and the
        latency-bound tail (the longest response finishing alone)."""
        mean, var = _capped_lognormal_moments(self.median, self.sigma, self.cap)
        total = np.maximum(rng.normal(samples * mean, math.sqrt(samples * var), shape), samples)
        u = np.clip(rng.random(shape), 1e-12, 1 - 1e-12) ** (1.0 / samples)  # the max's CDF value
        longest = np.minimum(self.cap, np.exp(math.log(self.median) + self.sigma * _inv_cdf(u)))
        slots = min(self.slots, samples)
        return total / slots, (1.0 - 1.0 / slots) * longest


def rollout_model(w: Workload) -> RolloutModel:
    return RolloutModel(w.length_median, w.length_sigma, float(w.length_cap), w.batch_slots)


# --- per-step draws --------------------------------------------------------------------------------


@dataclass
class StepPlan:
    """Every phase duration of every step of one job (seconds; arrays indexed by step)."""

    job: Job
    cls: ModelClass
    rollout_s: np.ndarray  # (steps, replicas): each right-sized replica's busy time
    colocated_rollout_s: np.ndarray  # (steps,): the rollout phase on the training layout
    reward_s: np.ndarray  # (steps,) CPU, devices idle (tool stalls included)
    logprob_s: np.ndarray
    train_s: np.ndarray
    sync_s: np.ndarray

    @property
    def replicas(self) -> int:
        return self.rollout_s.shape[1]

    def rollout_phase_s(self) -> np.ndarray:
        return self.rollout_s.max(axis=1)

    def work_floor_device_s(self) -> float:
        """Device-seconds of the job's phases on right-sized groups with zero switch cost. A weight
        sync counts on the train devices only: through the host tier that is all it holds, and the
        rollout side's reload of the new weights is a switch (so no mode bills below this floor)."""
        c = self.cls
        return float(c.replica_gpus * self.rollout_s.sum()
                     + c.train_gpus * (self.logprob_s.sum() + self.train_s.sum() + self.sync_s.sum()))


def _calibration(w: Workload, c: ModelClass) -> float:
    """Seconds per decode step such that the class's mean rollout phase on its split reservation
    equals its rollout share of the isolated step (a fixed-seed Monte Carlo: same workload, same
    scale)."""
    rng = np.random.default_rng([0xCA1, int(c.params_b * 1000)])
    replicas = c.rollout_gpus // c.replica_gpus
    phase = rollout_model(w).replica_steps(rng, w.samples_per_step // replicas, (4000, replicas)).max(axis=1)
    return w.shares.rollout * c.step_s / float(phase.mean())


def plan_steps(w: Workload, job: Job, *, scale: float | None = None) -> StepPlan:
    c = w.by_name(job.cls)
    scale = _calibration(w, c) if scale is None else scale
    rng = np.random.default_rng([job.seed, 0x57E9])
    model = rollout_model(w)
    n = job.steps
    replicas = c.rollout_gpus // c.replica_gpus
    rollout = scale * model.replica_steps(rng, w.samples_per_step // replicas, (n, replicas))
    # colocated: replicas of the training layout over rollout + train devices, slower per device
    co_replicas = (c.rollout_gpus + c.train_gpus) // c.train_mp
    bulk, tail = model.replica_parts(rng, max(1, w.samples_per_step // co_replicas), (n, co_replicas))
    # a replica of train_mp devices has train_mp / replica_gpus times a right-sized one's devices:
    # its bulk (throughput-bound) runs that much faster at colocated_efficiency per device; its tail
    # (one sequence's per-token latency) gains only (ratio ** tp_latency_exponent): tensor
    # parallelism adds an all-reduce per layer to every token
    ratio = c.train_mp / c.replica_gpus
    colocated = scale * (bulk / (ratio * w.colocated_efficiency) + tail / ratio**w.tp_latency_exponent).max(axis=1)

    def around(mean: float) -> np.ndarray:
        if mean <= 0:
            return np.zeros(n)
        s = math.sqrt(math.log(1 + w.phase_cv**2))
        return mean * np.exp(rng.normal(-s * s / 2, s, n))  # log-normal with that mean

    reward = around(w.shares.reward * c.step_s)
    if w.tool_stall_s > 0:
        s = w.tool_stall_sigma
        reward = reward + w.tool_stall_s * np.exp(rng.normal(-s * s / 2, s, n))
    return StepPlan(job, c, rollout, colocated, reward, around(w.shares.logprob * c.step_s),
                    around(w.shares.train * c.step_s), around(w.shares.sync * c.step_s))


def plan_all(w: Workload, jobs: list[Job]) -> list[StepPlan]:
    scales = {c.name: _calibration(w, c) for c in w.classes}
    return [plan_steps(w, j, scale=scales[j.cls]) for j in jobs]


# --- job sets --------------------------------------------------------------------------------------


def isolated_step_mean_s(w: Workload, c: ModelClass) -> float:
    """Mean isolated synchronous step (its definition: the class's step time; tool stalls add)."""
    return c.step_s + w.tool_stall_s


def arrival_rate(w: Workload) -> float:
    """Jobs per second: ``w.arrivals_per_s`` when the workload fixes it, else such that the isolated
    split deployment's offered load is ``w.load`` of the cluster: rate x E[devices x steps x step
    time] = load x gpus."""
    if w.arrivals_per_s is not None:
        return w.arrivals_per_s
    mean_steps = (w.steps_min + w.steps_max) / 2
    per_job = sum(c.fraction * (c.rollout_gpus + c.train_gpus) * mean_steps * isolated_step_mean_s(w, c)
                  for c in w.classes)
    return w.load * w.gpus / per_job


def generate_jobs(w: Workload, n: int, seed: int) -> list[Job]:
    """``n`` jobs: Poisson arrivals at ``arrival_rate``, classes by fraction, steps uniform."""
    if n < 1:
        raise ValueError("--jobs must be >= 1")
    rng = np.random.default_rng([seed, 0x10B5])
    gaps = rng.exponential(1.0 / arrival_rate(w), n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first job arrives at 0
    names = [c.name for c in w.classes]
    classes = rng.choice(len(names), size=n, p=[c.fraction for c in w.classes])
    steps = rng.integers(w.steps_min, w.steps_max + 1, n)
    seeds = rng.integers(0, 2**31, n)
    return [Job(f"job-{i:05d}", names[classes[i]], float(arrivals[i]), int(steps[i]), int(seeds[i]))
            for i in range(n)]


CSV_COLUMNS = ("job", "class", "arrival_s", "steps", "seed")


def load_jobs_csv(path: Path, w: Workload) -> list[Job]:
    """A user's trace: a CSV with a header ``job,class,arrival_s,steps[,seed]``; ``class`` names
    one of the workload's model classes. Errors name the line and the field."""
    jobs: list[Job] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in CSV_COLUMNS[:4] if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(CSV_COLUMNS)})")
        names = {c.name for c in w.classes}
        seen: set[str] = set()
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            job = (row["job"] or "").strip()
            if not job or job in seen:
                raise ValueError(f"{where}: job must be a unique, non-empty name")
            if row["class"] not in names:
                raise ValueError(f"{where}: class {row['class']!r} is not one of {sorted(names)}")
            try:
                arrival = float(row["arrival_s"])
                steps = int(row["steps"])
                seed = int(row.get("seed") or line)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if not (math.isfinite(arrival) and arrival >= 0) or steps < 1:
                raise ValueError(f"{where}: arrival_s must be >= 0 and steps >= 1")
            seen.add(job)
            jobs.append(Job(job, row["class"], arrival, steps, seed))
    if not jobs:
        raise ValueError(f"{path}: no jobs")
    return sorted(jobs, key=lambda j: (j.arrival, j.id))
