"""The model presets' recipes: plain data, so the spec and the platform's catalog read them without
torch (``engine.models.tiny`` builds one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyPreset:
    name: str
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 4
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention rejects 16
    max_positions: int = 64
    sft_steps: int = 1200
    sft_batch: int = 128
    sft_lr: float = 2e-3
    sft_warmup: float = 0.05
    sft_decay: float = 0.05  # final fraction of steps over which the rate falls linearly to zero
    sft_weight_decay: float = 0.1  # keeps the annealed base stable under RL learning rates
    seed: int = 0
    eval_size: int = 500
    threads: int = 2
    # Share of supervised examples that call the calculator ([expression] then its result); 0: none,
    # and the tokenizer has no tool tokens. Half: the base calls it for some problems, not others.
    tool_fraction: float = 0.0


TINY_ARITH = TinyPreset(name="tiny-arith")
TINY_ARITH_TOOLS = TinyPreset(name="tiny-arith-tools", sft_steps=600, tool_fraction=0.35)
