"""The live scheduler: one Ray actor per engine that runs the pure core on wall time.

Every API call goes router -> ``SchedulerService.submit`` -> the core's queue of its WPG; when the
core dispatches it, the service runs it on every rank of the WPG, tells the core it completed (with
the ranks' measured execution and switch seconds), and hands the caller its result together with
the call's usage records. The core's prefetch hints go to the WPG's ranks, which start reading that
job's state from the StateManager while the current call runs.

The actor is asynchronous (one event loop, no threads): decisions are made one at a time, in the
order events arrive. It is a named, detached actor so every job's driver reaches the same one;
``stop_scheduler`` ends it with the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import ray

from engine.api import Request
from engine.scheduler.core import STEP, Dispatch, Policy, Prefetch, Scheduler
from engine.scheduler.placement import ROLLOUT_FUNCTIONS

SCHEDULER_NAME = "plexrl-scheduler"


@ray.remote(num_cpus=0)
class SchedulerService:
    def __init__(self, policy: Policy | None = None):
        self.core = Scheduler(policy)
        self.groups: dict[str, Any] = {}  # name -> WorkerGroup
        self._waiting: dict[int, tuple[asyncio.Future, Request | ray.ObjectRef]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        # The clock of every usage record: Unix seconds (billing attributes calls to calendar months,
        # the dashboard draws them on a wall-clock timeline), advancing monotonically from the wall
        # time at start-up, so a clock adjustment never makes a call's end precede its start.
        self._origin = time.monotonic()
        self._wall_origin = time.time()
        self.switches = 0
        self.switch_seconds = 0.0
        self.prefetches = 0

    def _now(self) -> float:
        return self._wall_origin + (time.monotonic() - self._origin)

    def add_groups(self, groups: list[Any]) -> None:
        """Register worker groups (idempotent by name; a restarted group replaces the old handle)."""
        for g in groups:
            self.groups[g.name] = g
            rollout = g.serves & ROLLOUT_FUNCTIONS
            kind = "rollout" if g.serves <= ROLLOUT_FUNCTIONS else "both" if rollout else "train"
            self.core.add_wpg(g.name, devices=g.devices, capacity=g.max_resident, kind=kind)

    async def submit(self, job: str, role: str, fn: str, request: Request | list, wpgs: tuple[str, ...],
                     tenant: str, stream: str, seq: int) -> tuple[Any, list[dict]]:
        """Queue a call of ``fn`` for deployment (job, role) on ``wpgs`` (the first executes it) as
        call ``seq`` of the caller's ``stream``; returns (result, usage records) when it has run.
        ``request``: the Request, or ``[ObjectRef]`` to it (a bulky one, handed to the ranks
        unread). A failed call raises here, and its WPG is free again."""
        call = self.core.submit(job, role, fn, wpgs, self._now(), tenant, stream=stream, seq=seq)
        done = asyncio.get_running_loop().create_future()
        self._waiting[call.id] = (done, request[0] if isinstance(request, list) else request)
        mine = self._pump(inline=call.id)
        if mine is not None:  # dispatched at once: run it in this coroutine (no task to schedule)
            await self._run(mine)
        return await done

    def step(self, job: str, stream: str, seq: int) -> None:
        """A step of ``job`` starts after the caller's earlier calls (call ``seq`` of ``stream``)."""
        self.core.submit(job, "", STEP, (), self._now(), stream=stream, seq=seq)
        self._pump()

    def _pump(self, inline: int | None = None) -> Dispatch | None:
        """Apply the core's decisions; the dispatch of call ``inline``, if any, is returned for
        the caller to run instead of being started as a task."""
        mine = None
        now = self._now()
        decisions = self.core.decide(now)
        wake = self.core.next_wakeup(now)
        if wake is not None:  # a step held back for alignment: decide again when it may start
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(wake - now, self._pump)
        for decision in decisions:
            if isinstance(decision, Prefetch):
                self.prefetches += 1
                self.groups[decision.wpg].prefetch(decision.deployment)
            elif decision.call.id == inline:
                mine = decision
            else:
                task = asyncio.get_running_loop().create_task(self._run(decision))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return mine

    async def _run(self, dispatch: Dispatch) -> None:
        call = dispatch.call
        done, request = self._waiting.pop(call.id)
        ranks = self.groups[call.wpgs[0]].ranks
        outcomes = await asyncio.gather(*[rank.run.remote(request) for rank in ranks], return_exceptions=True)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            self.core.complete(call.id, self._now())
            done.set_exception(failed)
        else:
            # the WPG is busy until its slowest rank is done; rank 0's result is the call's result
            setup = max(o[1]["setup_s"] for o in outcomes)
            exec_s = max(o[1]["exec_s"] for o in outcomes)
            records = self.core.complete(call.id, self._now(), exec_s=exec_s, setup_s=setup)
            if dispatch.switches and setup > 0:
                self.switches += len(dispatch.switches)
                self.switch_seconds += setup
                for wpg in dispatch.switches:  # measured switch cost: the next estimate for this job here
                    self.core.set_switch_cost(call.deployment, wpg, setup / len(dispatch.switches))
            done.set_result((outcomes[0][0], [r.to_dict() for r in records]))
        self._pump()

    def pause(self, job: str) -> None:
        self.core.pause(job)

    def resume(self, job: str) -> None:
        self.core.resume(job)
        self._pump()

    def set_weight(self, tenant: str, weight: float) -> None:
        self.core.set_weight(tenant, weight)

    def forget(self, job: str) -> None:
        self.core.forget(job)

    def stats(self) -> dict[str, Any]:
        return {
            "queued": len(self.core.queue),
            "running": len(self.core.running),
            "switches": self.switches,
            "switch_seconds": self.switch_seconds,
            "prefetches": self.prefetches,
            "estimates": {f"{j}/{fn}": v for (j, fn), v in self.core.estimates.items()},
        }


def scheduler_service(groups: list[Any] | None = None, policy: Policy | None = None):
    """The engine's scheduler actor (started on first use), with ``groups`` registered."""
    handle = SchedulerService.options(name=SCHEDULER_NAME, lifetime="detached", get_if_exists=True).remote(policy)
    if groups:
        ray.get(handle.add_groups.remote(list(groups)))
    return handle


def stop_scheduler() -> None:
    with contextlib.suppress(ValueError):  # none running
        ray.kill(ray.get_actor(SCHEDULER_NAME))
