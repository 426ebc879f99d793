"""The router: turns an API call into a ``Request`` and enqueues it on the deployment's WPG.

It keeps no decision of its own: placement comes from the scheduler's policy
(``engine.scheduler.placement``) and is recorded in ``placement`` only so that later calls of the
same deployment find their groups (``{(job, role): Placement}``). A policy split over a trainer and
a rollout group gets ``sync_weights`` on the rollout group, told which trainer ranks to pull from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from engine.api import OptimizerConfig, Request
from engine.scheduler.placement import GroupView, Placement, place_deployment
from engine.workers.group import NOOP, WorkerGroup


class Future:
    """The result of one API call, available later; ``result()`` waits for it."""

    def __init__(self, ref: ray.ObjectRef, request: Request):
        self._ref = ref
        self.request = request

    def result(self, timeout: float | None = None) -> Any:
        return ray.get(self._ref, timeout=timeout)

    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)


class Router:
    def __init__(self, groups: Sequence[WorkerGroup]):
        self.groups = {g.name: g for g in groups}
        self.placement: dict[tuple[str, str], Placement] = {}

    def create(
        self, job: str, role: str, model_dir: Path, *, trainable: bool, optimizer: OptimizerConfig | None,
        trainer_kind: str | None = None, rollout_kind: str | None = None,
    ) -> dict[str, Any]:
        if (job, role) in self.placement:
            raise ValueError(f"deployment {(job, role)} already exists")
        resident: dict[str, int] = dict.fromkeys(self.groups, 0)
        for placed in self.placement.values():
            for name in {placed.trainer, placed.rollout} - {None}:
                resident[name] += 1
        views = [GroupView(g.name, g.serves, resident[g.name], g.kind.value) for g in self.groups.values()]
        placed = place_deployment(views, role, trainer_kind=trainer_kind, rollout_kind=rollout_kind)
        info = self.groups[placed.trainer].create((job, role), model_dir, trainable=trainable, optimizer=optimizer)
        if placed.split:
            # the rollout side starts from the same base weights; sync_weights refreshes it
            self.groups[placed.rollout].create((job, role), model_dir, trainable=False, optimizer=None)
        self.placement[(job, role)] = placed
        return {**info, "group": placed.trainer, "rollout_group": placed.rollout}

    def call(self, job: str, role: str, fn: str, payload: dict[str, Any]) -> Future:
        try:
            placed = self.placement[(job, role)]
        except KeyError:
            raise KeyError(f"no deployment {(job, role)}; call create_model first") from None
        group = self.groups[placed.group_for(fn)]
        if fn not in group.serves and fn != NOOP:
            raise ValueError(f"worker group {group.name} does not serve {fn!r}")
        if fn == "sync_weights" and placed.split:
            # The rollout ranks pull the trainer's shards; each pull queues behind the trainer
            # ranks' earlier calls (Ray actor order), so the sync sees every finished optim_step.
            payload = {**payload, "source": self.groups[placed.trainer].ranks}
        request = Request(job=job, role=role, fn=fn, payload=payload)
        return Future(group.submit(request), request)
