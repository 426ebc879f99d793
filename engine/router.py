"""The router: turns an API call into a ``Request`` and enqueues it on the deployment's WPG.

It keeps no decision of its own: placement comes from the scheduler's policy
(``engine.scheduler.placement``) and is recorded in ``placement`` only so that later calls of the
same deployment find their group (``{(job, role): group_name}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from engine.api import OptimizerConfig, Request
from engine.scheduler.placement import GroupView, place_deployment
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
        self.placement: dict[tuple[str, str], str] = {}

    def create(
        self, job: str, role: str, model_dir: Path, *, trainable: bool, optimizer: OptimizerConfig | None
    ) -> dict[str, Any]:
        if (job, role) in self.placement:
            raise ValueError(f"deployment {(job, role)} already exists")
        resident: dict[str, int] = dict.fromkeys(self.groups, 0)
        for name in self.placement.values():
            resident[name] += 1
        views = [GroupView(g.name, g.serves, resident[g.name]) for g in self.groups.values()]
        name = place_deployment(views, role)
        info = self.groups[name].create((job, role), model_dir, trainable=trainable, optimizer=optimizer)
        self.placement[(job, role)] = name
        return {**info, "group": name}

    def call(self, job: str, role: str, fn: str, payload: dict[str, Any]) -> Future:
        try:
            group = self.groups[self.placement[(job, role)]]
        except KeyError:
            raise KeyError(f"no deployment {(job, role)}; call create_model first") from None
        if fn not in group.serves and fn != NOOP:
            raise ValueError(f"worker group {group.name} does not serve {fn!r}")
        request = Request(job=job, role=role, fn=fn, payload=payload)
        return Future(group.submit(request), request)
