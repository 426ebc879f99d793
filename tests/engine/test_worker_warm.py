"""A worker rank loads what its backend's ``create`` needs while its group starts, so a job's first
call on a new group is not held up by the group's own start-up: on a shared group, the first job's
``create`` would otherwise hold the group for seconds (transformers' import) that no later job's
pays, and a dedicated run's ``create`` would measure that start-up as the job's own work (what
``plexrl sim --from-bench`` replays for every job on a shared group). Measured on this machine, a
new torch group's first ``create`` took 0.36 s (1.1 s where the node's StateManager had yet to
start) against 0.03 s for the next, until the start-up also built a tiny model of each
architecture and reached the StateManager."""

from __future__ import annotations

import sys

import ray

from engine.workers.backend import DECODERS
from engine.workers.group import Swapping, WorkerGroup


def _loaded(_rank, module: str) -> bool:
    return module in sys.modules


def test_a_started_torch_rank_has_imported_the_model_classes_before_any_create(ray_engine, plexrl_home):
    group = WorkerGroup.start("test-torch-warm", threads=1, data_dir=plexrl_home)  # a new rank process
    try:
        rank = group.ranks[0]
        assert ray.get(rank.__ray_call__.remote(_loaded, "transformers.models.auto.modeling_auto"))
        assert not ray.get(rank.__ray_call__.remote(lambda self: bool(self.backend.states)))  # nothing created
    finally:
        group.shutdown()


def _not_loaded(_rank, architectures) -> list[str]:
    """The architectures whose modeling module the rank has not imported (found by model type from
    transformers' table, so that asking imports nothing)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = {arch: t for t, arch in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    return [a for a in sorted(architectures)
            if f"transformers.models.{model_type[a]}.modeling_{model_type[a]}" not in sys.modules]


def _draws_as_seeded(_rank) -> bool:
    import torch

    drawn = torch.rand(4)
    torch.manual_seed(0)
    return torch.equal(drawn, torch.rand(4))


def test_a_started_swapping_rank_has_built_each_architecture_and_reached_its_state_manager(ray_engine, plexrl_home):
    group = WorkerGroup.start("test-torch-warm-swap", threads=1, data_dir=plexrl_home,
                              swapping=Swapping(max_resident=1))
    try:
        rank = group.ranks[0]
        assert ray.get(rank.__ray_call__.remote(_not_loaded, DECODERS)) == []
        assert ray.get(rank.__ray_call__.remote(lambda self: self.backend.state_client.reached))
        # the tiny models' random weights drew nothing from the rank's generator (seeded at its start)
        assert ray.get(rank.__ray_call__.remote(_draws_as_seeded))
        assert not ray.get(rank.__ray_call__.remote(lambda self: bool(self.backend.states)))
    finally:
        group.shutdown()
