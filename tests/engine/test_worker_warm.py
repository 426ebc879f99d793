"""A worker rank loads what its backend's ``create`` needs while its group starts, so a job's first
call on a new group is not held up by the group's own start-up: on a shared group, the first job's
``create`` would otherwise hold the group for seconds (transformers' import) that no later job's
pays, and a dedicated run's ``create`` would measure that start-up as the job's own work (what
``plexrl sim --from-bench`` replays for every job on a shared group)."""

from __future__ import annotations

import sys

import ray

from engine.workers.group import WorkerGroup


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
