"""Worker process groups on Ray: ``WorkerRank`` actors and the ``WorkerGroup`` handle over them.

A WPG is created once by the engine runtime and outlives jobs; the router sends it requests.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from engine.api import OptimizerConfig, Request
from engine.workers.backend import BackendKind, backend_class
from engine.workers.layout import gather_shards

NOOP = "noop"  # a call that does nothing in the rank: probes the call path (liveness, overhead)
DEVICE_RESOURCE = "device"  # per-node custom resource: one slot per accelerator (or CPU slot)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@ray.remote(num_cpus=0)
class WorkerRank:
    """One rank of a WPG. Executes calls one at a time, in submission order (Ray actor order)."""

    def __init__(
        self, kind: str, rank: int, world_size: int, threads: int, data_dir: str, dist_url: str | None = None
    ):
        import torch

        # Pinned so results do not depend on where (or beside what) the actor runs.
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.rank = rank
        # dist_url only where there is one, so single-rank backends need not know the argument
        extra = {} if dist_url is None else {"dist_url": dist_url}
        self.backend = backend_class(kind)(rank=rank, world_size=world_size, data_dir=Path(data_dir), **extra)

    def create(self, deployment, model_dir: str, trainable: bool, optimizer: OptimizerConfig | None):
        return self.backend.create(
            tuple(deployment), Path(model_dir), trainable=trainable, optimizer=optimizer
        )

    def drop(self, deployment) -> None:
        self.backend.drop(tuple(deployment))

    def execute(self, request: Request) -> Any:
        if request.fn == NOOP:
            return None
        return self.backend.execute(request.deployment, request.fn, request.payload)

    def export_weights(self, deployment, names: list[str] | None = None):
        return self.backend.export_weights(tuple(deployment), names)

    def weight_names(self, deployment) -> list[str]:
        return self.backend.weight_names(tuple(deployment))

    def stats(self) -> dict[str, Any]:
        return self.backend.stats()

    def info(self) -> dict[str, Any]:
        import torch

        return {"pid": os.getpid(), "threads": torch.get_num_threads(), "rank": self.rank}

    def ping(self) -> None:
        return None


@dataclass
class WorkerGroup:
    """Handle over a WPG's ranks; picklable, so it can be handed to a job's driver actor."""

    name: str
    kind: BackendKind
    ranks: list[Any]  # WorkerRank actor handles
    serves: frozenset[str]

    @classmethod
    def start(
        cls, name: str, kind: BackendKind | str = BackendKind.TORCH, *, world_size: int = 1,
        threads: int = 2, data_dir: Path, devices_per_rank: float = 1.0,
    ) -> WorkerGroup:
        kind = BackendKind(kind)
        # Ranks of a multi-rank group meet at a free local port (torch.distributed rendezvous).
        dist_url = f"tcp://127.0.0.1:{_free_port()}" if world_size > 1 else None
        # On a GPU node a device slot is a GPU: Ray hands each rank its share (CUDA_VISIBLE_DEVICES).
        gpus = devices_per_rank if ray.cluster_resources().get("GPU", 0) > 0 else 0
        ranks = [
            WorkerRank.options(
                name=f"wpg:{name}:{rank}", resources={DEVICE_RESOURCE: devices_per_rank}, num_gpus=gpus,
            ).remote(kind.value, rank, world_size, threads, str(data_dir), dist_url)
            for rank in range(world_size)
        ]
        ray.get([r.ping.remote() for r in ranks])
        return cls(name=name, kind=kind, ranks=ranks, serves=backend_class(kind).serves)

    def create(self, deployment, model_dir: Path, *, trainable: bool, optimizer: OptimizerConfig | None):
        refs = [r.create.remote(deployment, str(model_dir), trainable, optimizer) for r in self.ranks]
        return ray.get(refs)[0]

    def submit(self, request: Request) -> ray.ObjectRef:
        """Every rank executes the call (SPMD); rank 0's result is the call's result."""
        refs = [r.execute.remote(request) for r in self.ranks]
        return refs[0]

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)


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
