"""The job spec: one frozen dataclass that validates itself (the CLI and the platform both use it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from engine.errors import SpecError
from engine.rl.grpo import GRPOConfig
from engine.rl.tasks import TASKS

ALGORITHMS = ("grpo",)


@dataclass(frozen=True)
class JobSpec:
    task: str = "arith"
    model: str = "tiny-arith"  # preset name or local Hugging Face model folder
    steps: int = 150
    seed: int = 0
    algorithm: str = "grpo"
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self):
        if self.task not in TASKS:
            raise SpecError("task", f"unknown task {self.task!r}; known: {', '.join(sorted(TASKS))}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise SpecError("steps", f"must be a positive integer, got {self.steps!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SpecError("seed", f"must be a non-negative integer, got {self.seed!r}")
        if self.algorithm not in ALGORITHMS:
            raise SpecError("algorithm", f"unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}")
        if not self.model or not isinstance(self.model, str):
            raise SpecError("model", "is required")
        if not isinstance(self.grpo, GRPOConfig):
            raise SpecError("grpo", f"must be a GRPO config, got {type(self.grpo).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], "unknown field")
        grpo = data.pop("grpo", None) or {}
        if isinstance(grpo, dict):
            fields = {f.name for f in dataclasses.fields(GRPOConfig)}
            bad = sorted(set(grpo) - fields)
            if bad:
                raise SpecError(f"grpo.{bad[0]}", "unknown field")
            try:
                grpo = GRPOConfig(**grpo)
            except SpecError as exc:  # name the field as the caller spelled it: grpo.lr, not lr
                raise SpecError(f"grpo.{exc.field}", exc.message) from None
        return cls(grpo=grpo, **data)
