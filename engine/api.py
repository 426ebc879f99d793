"""Plain data that crosses the function API: small frozen dataclasses and numpy arrays.

Algorithm code gets these through ``engine.client``; backends receive and return them. Arrays, not
torch tensors, cross it: a job's driver (the algorithm loop) then never needs torch in memory, and a
backend turns them into tensors on its own device (``as_tensor``), bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROLES = ("policy", "reference")
FUNCTIONS = (
    "generate",
    "forward",
    "forward_backward",
    "optim_step",
    "sync_weights",
    "save_checkpoint",
    "load_checkpoint",
)
# Which side of a deployment serves each function: its trainer, or (a policy's) rollout copy.
TRAIN_FUNCTIONS = frozenset({"forward", "forward_backward", "optim_step", "save_checkpoint", "load_checkpoint"})
ROLLOUT_FUNCTIONS = frozenset({"generate", "sync_weights"})


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0  # 0 = greedy
    max_tokens: int = 16
    seed: int = 0  # seeds this call's sampling; same seed and inputs, same samples
    # Tokens that end a sample like EOS does (and are kept as its last token), e.g. the close of a
    # tool call, so the environment can act before generation goes on.
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.n < 1:
            raise ValueError("n must be >= 1")
        stops = tuple(self.stop_token_ids)
        if not all(type(t) is int and t >= 0 for t in stops):
            raise ValueError("stop_token_ids must be token ids (non-negative ints)")
        object.__setattr__(self, "stop_token_ids", stops)  # a list would make the params unhashable
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")


@dataclass(frozen=True)
class Completion:
    prompt_index: int  # which prompt of the call this answers
    token_ids: list[int]
    text: str
    logprobs: list[float]  # log-prob of each sampled token under the model (temperature 1)


@dataclass(frozen=True)
class Batch:
    """Sequences for ``forward`` / ``forward_backward``: a prompt and a completion per row.

    Loss inputs ride along as float arrays aligned with completion tokens (``[B, T]``, T the
    longest completion, zero-padded) or per row (``advantages: [B]``). Anything array-like is taken
    and kept as a numpy array: a float array or CPU tensor with its dtype, a list as float32.
    """

    prompts: list[list[int]]
    completions: list[list[int]]
    advantages: np.ndarray | None = None
    old_logprobs: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None

    def __post_init__(self):
        if len(self.prompts) != len(self.completions) or not self.prompts:
            raise ValueError("a batch needs as many prompts as completions, and at least one")
        for name, dims in (("advantages", 1), ("old_logprobs", 2), ("ref_logprobs", 2)):
            value = getattr(self, name)
            if value is None:
                continue
            array = np.asarray(value)
            if not hasattr(value, "dtype") or not np.issubdtype(array.dtype, np.floating):
                array = array.astype(np.float32)  # a list, or integers: float32, as the API's own arrays
            if array.ndim != dims or array.shape[0] != len(self.prompts):
                raise ValueError(f"{name} must have shape {'[B]' if dims == 1 else '[B, T]'} with B = "
                                 f"{len(self.prompts)} rows, got {list(array.shape)}")
            object.__setattr__(self, name, array)

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, rows: list[int]) -> Batch:
        """The sub-batch of ``rows`` (loss tensors trimmed to its own longest completion)."""
        t = max(len(self.completions[i]) for i in rows) if rows else 0

        def take(x: np.ndarray | None, per_token: bool) -> np.ndarray | None:
            if x is None:
                return None
            x = x[np.asarray(rows, dtype=np.int64)]
            return x[:, :t] if per_token else x

        return Batch(
            prompts=[self.prompts[i] for i in rows],
            completions=[self.completions[i] for i in rows],
            advantages=take(self.advantages, False),
            old_logprobs=take(self.old_logprobs, True),
            ref_logprobs=take(self.ref_logprobs, True),
        )


@dataclass(frozen=True)
class ForwardResult:
    logprobs: np.ndarray  # [B, T] float32 per completion token, zero past each completion's end
    mask: np.ndarray  # [B, T] bool


def as_tensor(array: np.ndarray | None, device: Any = None, dtype: Any = None):
    """An API array as a torch tensor on ``device`` (None stays None); for backends, never for
    algorithm code."""
    import torch

    if array is None:
        return None
    # a copy: arrays from Ray's object store are read-only, and the loss inputs are small
    return torch.tensor(np.asarray(array), device=device, dtype=dtype)


@dataclass(frozen=True)
class LossResult:
    loss: float
    tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warm-up
    decay_steps: int = 0  # if set, cosine decay to zero at this optimizer step (0: constant rate)

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError("lr must be > 0")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError("warmup_steps and decay_steps must be >= 0")

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        if self.warmup_steps and step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps:
            span = max(1, self.decay_steps - 1 - self.warmup_steps)
            progress = min(1.0, (step - self.warmup_steps) / span)
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr


@dataclass(frozen=True)
class Request:
    """One API call on its way to a worker group (built by the Router)."""

    job: str
    role: str
    fn: str
    payload: dict[str, Any]
    estimate_s: float | None = None  # the scheduler's execution-time estimate, if it has one

    @property
    def deployment(self) -> tuple[str, str]:
        return (self.job, self.role)
