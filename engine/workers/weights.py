"""The read side of ``sync_weights``: a deployment's trainer weights pulled from the training
group's ranks, one logical tensor at a time, for a rollout (or colocated) backend to load."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import ray
import torch

from engine.state.layout import gather_shards


def pull_weights(
    source: list[Any], deployment, *, window: int = 8,
) -> tuple[list[str], Iterator[tuple[str, torch.Tensor]]]:
    """A deployment's trainer weights from ``source`` (the trainer group's ``WorkerRank`` handles):
    the canonical names, and an iterator that gathers one logical tensor at a time.

    At most ``window`` logical tensors are in flight (fetched ahead while the consumer converts
    and loads the current one), so a sync costs a few round trips, not one per tensor, and the
    whole model is never assembled at once. Each fetch queues behind the trainer ranks' earlier
    calls (Ray actor order), so a sync sees every optimizer step submitted before it.
    """
    names = ray.get(source[0].weight_names.remote(deployment))

    def fetch(name: str):
        return name, [rank.export_weights.remote(deployment, [name]) for rank in source]

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        queue = collections.deque(fetch(n) for n in names[:window])
        upcoming = iter(names[window:])
        while queue:
            name, refs = queue.popleft()
            following = next(upcoming, None)
            if following is not None:
                queue.append(fetch(following))
            parts = ray.get(refs)
            yield name, gather_shards([(t, spec) for part in parts for _, t, spec in part])

    return names, tensors()
