"""The router: turns an API call into a ``Request`` and queues it at the scheduler for its WPG.

It keeps no decision of its own: placement comes from the scheduler's policy
(``engine.scheduler.placement``) and is recorded in ``placement`` only so that later calls of the
same deployment find their groups (``{(job, role): Placement}``); when a call runs is the live
scheduler's decision (``engine.scheduler.service``). A policy split over a trainer and a rollout
group gets ``sync_weights`` on the rollout group, told which trainer ranks to pull from; the call
holds both groups while it runs.

Each call's usage records (metering) come back with its result and go to the caller's ``on_usage``
(the client writes them to the job's event log) exactly once, when the future is first resolved.
"""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from engine.api import OptimizerConfig, Request
from engine.scheduler.placement import GroupView, Placement, place_deployment
from engine.scheduler.service import scheduler_service
from engine.workers.group import BULKY, CREATE, NOOP, WorkerGroup

UsageSink = Callable[[list[dict[str, Any]]], None]


class Future:
    """The result of one API call, available later; ``result()`` waits for it."""

    _UNSET = object()

    def __init__(self, ref: ray.ObjectRef, request: Request, on_usage: UsageSink | None = None):
        self._ref = ref
        self.request = request
        self._on_usage = on_usage
        self._value: Any = self._UNSET

    def result(self, timeout: float | None = None) -> Any:
        if self._value is self._UNSET:
            value, usage = ray.get(self._ref, timeout=timeout)
            if self.request.fn in BULKY:
                value = ray.get(value[0], timeout=timeout)  # fetched from the rank, not via the scheduler
            if self._on_usage is not None:
                self._on_usage(usage)
            self._value = value
        return self._value

    def done(self) -> bool:
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)


class Router:
    def __init__(self, groups: Sequence[WorkerGroup], *, tenant: str = ""):
        self.groups = {g.name: g for g in groups}
        self.placement: dict[tuple[str, str], Placement] = {}
        self.scheduler = scheduler_service(list(groups))
        self.tenant = tenant
        # this router's calls of each job are numbered, so the scheduler runs them in this order
        self._stream = uuid.uuid4().hex
        self._seq: defaultdict[str, itertools.count] = defaultdict(itertools.count)

    def create(
        self, job: str, role: str, model_dir: Path, *, trainable: bool, optimizer: OptimizerConfig | None,
        trainer_kind: str | None = None, rollout_kind: str | None = None, on_usage: UsageSink | None = None,
    ) -> dict[str, Any]:
        if (job, role) in self.placement:
            raise ValueError(f"deployment {(job, role)} already exists")
        resident: dict[str, int] = dict.fromkeys(self.groups, 0)
        for placed in self.placement.values():
            for name in {placed.trainer, placed.rollout} - {None}:
                resident[name] += 1
        views = [GroupView(g.name, g.serves, resident[g.name], g.kind.value) for g in self.groups.values()]
        placed = place_deployment(views, role, trainer_kind=trainer_kind, rollout_kind=rollout_kind)
        payload = {"model_dir": str(model_dir), "trainable": trainable, "optimizer": optimizer}
        info = self._submit(Request(job, role, CREATE, payload), (placed.trainer,), on_usage).result()
        if placed.split:
            # the rollout side starts from the same base weights; sync_weights refreshes it
            payload = {**payload, "trainable": False, "optimizer": None, "side": "rollout"}
            self._submit(Request(job, role, CREATE, payload), (placed.rollout,), on_usage).result()
        self.placement[(job, role)] = placed
        return {**info, "group": placed.trainer, "rollout_group": placed.rollout}

    def call(self, job: str, role: str, fn: str, payload: dict[str, Any], on_usage: UsageSink | None = None) -> Future:
        try:
            placed = self.placement[(job, role)]
        except KeyError:
            raise KeyError(f"no deployment {(job, role)}; call create_model first") from None
        group = self.groups[placed.group_for(fn)]
        if fn not in group.serves and fn != NOOP:
            raise ValueError(f"worker group {group.name} does not serve {fn!r}")
        wpgs: tuple[str, ...] = (group.name,)
        if fn == "sync_weights" and placed.split:
            # The rollout ranks pull the trainer's shards while the call holds both groups; the
            # job's calls run in order, so the sync sees every optim_step submitted before it.
            payload = {**payload, "source": self.groups[placed.trainer].ranks}
            wpgs = (group.name, placed.trainer)
        return self._submit(Request(job=job, role=role, fn=fn, payload=payload), wpgs, on_usage)

    def mark_step(self, job: str) -> None:
        """Tell the scheduler that ``job``'s next step starts after the calls made so far (it
        profiles the job's steps, then keeps them on their phase). Does not wait."""
        self.scheduler.step.remote(job, self._stream, next(self._seq[job]))

    def _submit(self, request: Request, wpgs: tuple[str, ...], on_usage: UsageSink | None) -> Future:
        seq = next(self._seq[request.job])
        body = [ray.put(request)] if request.fn in BULKY else request  # nested: passed on unread
        ref = self.scheduler.submit.remote(request.job, request.role, request.fn, body, wpgs, self.tenant,
                                           self._stream, seq)
        return Future(ref, request, on_usage)
