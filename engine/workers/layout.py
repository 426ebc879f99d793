"""Logical tensors and their shards: the one place that knows how a model's weights are laid out.

A trainer rank exports its weights as ``(name, tensor, ShardSpec)`` triples, where ``name`` is the
Hugging Face (canonical) tensor name and the spec says which slice of that logical tensor the rank
holds. A consumer with another layout gathers the slices of one logical tensor at a time, so a
whole model never has to exist twice in memory. Backend-specific conversions (Megatron fused QKV,
gated MLP, vocab-parallel embeddings <-> Hugging Face Qwen2) live in this module too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardSpec:
    """Slice ``index`` of ``count`` equal parts of a logical tensor along ``dim``; ``dim=None``: whole."""

    dim: int | None = None
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"bad shard {self.index} of {self.count}")
        if self.dim is None and self.count != 1:
            raise ValueError("a whole tensor has one shard")


WHOLE = ShardSpec()

WeightShard = tuple[str, torch.Tensor, ShardSpec]


def gather_shards(shards: Sequence[tuple[torch.Tensor, ShardSpec]]) -> torch.Tensor:
    """The logical tensor from its shards (any order; replicas of a whole tensor collapse to one)."""
    if not shards:
        raise ValueError("no shards to gather")
    specs = {spec for _, spec in shards}
    if specs == {WHOLE}:
        return shards[0][0]
    dims = {spec.dim for spec in specs}
    counts = {spec.count for spec in specs}
    if len(dims) != 1 or len(counts) != 1 or None in dims:
        raise ValueError(f"inconsistent shard specs {sorted(map(str, specs))}")
    count = counts.pop()
    by_index = {spec.index: t for t, spec in shards}
    if sorted(by_index) != list(range(count)):
        raise ValueError(f"shards {sorted(by_index)} do not cover 0..{count - 1}")
    return torch.cat([by_index[i] for i in range(count)], dim=dims.pop())
