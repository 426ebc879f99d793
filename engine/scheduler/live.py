"""The live scheduler: one Ray actor per engine that runs the pure core on wall time.

Every API call goes router -> ``SchedulerService.submit`` -> the core's queue of its WPG; when the
core dispatches it, the service runs it on every rank of the WPG, tells the core it completed (with
the ranks' measured execution and switch seconds), and hands the caller its result together with
the call's usage records. The core's prefetch hints go to the WPG's ranks, which start reading that
job's state from the StateManager while the current call runs.

The actor is asynchronous (one event loop, no threads): decisions are made one at a time, in the
order events arrive. It is a named, detached actor so every job's driver reaches the same one;
``stop_scheduler`` ends it with the engine. It keeps the tenants' weights and budgets and the jobs'
priorities in memory only: the engine's controller starts it with the ones it recorded
(``engine.service.tenants``), so one started after another died has them before its first call.

A Ray actor call costs a millisecond or more on a small node, and a call through the scheduler
would pay two of them (caller -> scheduler -> rank) where a direct call pays one. Routers on the
scheduler's node therefore submit over a Unix socket served by the same event loop (``endpoint``;
framing in ``engine.support.wire``): the call is queued and run exactly as an actor ``submit``, and its
answer comes back on the socket (a bulky result is fetched from the rank by the scheduler, as the
socket cannot carry an object reference). Routers elsewhere, or whose socket broke, use the actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from engine.api import ROLLOUT_FUNCTIONS, Request
from engine.errors import EngineFault, fault_reason, is_engine_fault
from engine.scheduler.core import STEP, Dispatch, Policy, Prefetch, Scheduler
from engine.support.wire import frame, listen_on_node, read_frame, sendable_error
from engine.workers.group import BULKY, publishes_to

_log = logging.getLogger(__name__)

SCHEDULER_NAME = "plexrl-scheduler"


@ray.remote(num_cpus=0)
class SchedulerService:
    """``tenants``: ``{tenant: {"weight": w, "budget": device-seconds left or None}}`` (either may
    be absent) and ``priorities``: ``{job: factor}``, in force before any call is submitted."""

    def __init__(self, policy: Policy | None = None, tenants: dict[str, dict[str, float | None]] | None = None,
                 priorities: dict[str, float] | None = None):
        self.core = Scheduler(policy)
        for tenant, state in (tenants or {}).items():
            if state.get("weight") is not None:
                self.core.set_weight(tenant, state["weight"])
            self.core.set_budget(tenant, state.get("budget"))
        for job, factor in (priorities or {}).items():
            self.core.set_priority(job, factor)
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
        self._endpoint: tuple[str, str] | None = None
        self._server: asyncio.AbstractServer | None = None
        self._socket_tried = False
        self.socket_calls = 0  # calls submitted over the socket (tests and benchmarks see it is used)
        self.lost: dict[str, str] = {}  # WPG -> why it is unusable (a rank died), until replaced

    def _now(self) -> float:
        return self._wall_origin + (time.monotonic() - self._origin)

    def ping(self) -> None:
        return None

    def add_groups(self, groups: list[Any]) -> None:
        """Register worker groups (idempotent by name; a restarted group replaces the old handle,
        holding no job's state yet)."""
        for g in groups:
            if g.name in self.groups and self.groups[g.name].ranks != g.ranks:
                self.lost.pop(g.name, None)
                self.core.reset_wpg(g.name)
            self.groups[g.name] = g
            rollout = g.serves & ROLLOUT_FUNCTIONS
            kind = "rollout" if g.serves <= ROLLOUT_FUNCTIONS else "both" if rollout else "train"
            self.core.add_wpg(g.name, devices=g.devices, capacity=g.max_resident, kind=kind)

    def remove_groups(self, names: list[str]) -> None:
        """Worker groups released (no job uses them): they leave the scheduler (ValueError if one
        still has calls queued or running)."""
        for name in names:
            if name in self.groups:
                self.core.remove_wpg(name)
                del self.groups[name]
                self.lost.pop(name, None)

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

    async def endpoint(self) -> tuple[str, str] | None:
        """(node id, path) of the Unix socket on which routers of this node submit; None when
        there is none (the actor serves them all). Opened on the first ask."""
        if not self._socket_tried:
            self._socket_tried = True
            from engine.state.store import default_host_dir

            folder = default_host_dir().parent  # this user's folder on the node
            try:
                sock, path = listen_on_node(folder, "scheduler")
                self._server = await asyncio.start_unix_server(self._serve, sock=sock)
                self._endpoint = (ray.get_runtime_context().get_node_id(), path)
            except OSError as exc:  # e.g. a path over the 107 bytes a Unix socket may have
                _log.warning("scheduler: no node socket (%s); routers use the actor", exc)
        return self._endpoint

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One router's connection: ``(id, method, args)`` frames; ``submit`` is answered with
        ``(id, ok, value)`` when its call has run (calls run concurrently, answers in any order),
        ``step`` is not answered."""
        try:
            while True:
                call_id, method, args = await read_frame(reader)
                if method == "step":
                    self.step(*args)
                    continue
                self.socket_calls += 1
                task = asyncio.get_running_loop().create_task(self._answer(writer, call_id, args))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the router went away; its calls still run (their answers have nowhere to go)
        except Exception:  # a frame that did not unpickle here: the router's calls fail, then use the actor
            _log.exception("scheduler: dropping a router's connection")
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, call_id: int, args: tuple) -> None:
        fn = args[2]
        try:
            value, usage = await self.submit(*args)
            if fn in BULKY:
                value = await value[0]  # the rank's reference: the socket carries the value
            reply = frame((call_id, True, (value, usage)))
        except Exception as exc:  # the router raises it from the call's future
            reply = frame((call_id, False, sendable_error(exc)))
        if writer.is_closing():
            return
        writer.write(reply)  # one frame per write, on one event loop: frames never interleave
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    def close(self) -> None:
        """Stop serving the socket and remove it (the actor is about to be killed)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._endpoint is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._endpoint[1])
            self._endpoint = None

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
        wpg = call.wpgs[0]
        published = publishes_to(request) if isinstance(request, Request) else None
        lost = [self.lost[w] for w in call.wpgs if w in self.lost]
        cause = None  # of the call's failure, when a rank died: the other ranks' errors follow from it
        if lost:  # a group that lost a rank runs nothing until the engine replaces it
            cause = EngineFault(lost[0])
            outcomes: list = [cause]
        else:
            ranks = self.groups[wpg].ranks
            if len(ranks) > 1 and not isinstance(request, ray.ObjectRef):
                request = ray.put(request)  # stored once for all the ranks (a socket call's arrives by value)
            outcomes = await _run_on(ranks, request)
            dead = [i for i, o in enumerate(outcomes) if _died(o)]
            if dead:
                self.lost[wpg] = f"worker group {wpg} lost rank {dead[0]} during {call.fn} of {call.job}"
                _log.warning("scheduler: %s", self.lost[wpg])
                cause = EngineFault(self.lost[wpg])
            # a rank that failed because another process died (the trainer a sync pulls from, the
            # StateManager that held the job's state)
            outcomes = [EngineFault(f"{call.fn} of {call.job} on {wpg}: {fault_reason(o)}")
                        if isinstance(o, RayTaskError) and is_engine_fault(o.cause) else o
                        for o in outcomes]
        failed = cause or next((o for o in outcomes if isinstance(o, BaseException)), None)
        if published is not None:  # before the job's next call can be dispatched
            failed = await self._weights_changed(published, call.deployment, complete=failed is None) or failed
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

    async def _weights_changed(self, rollout: str, deployment: tuple[str, str], *,
                               complete: bool) -> BaseException | None:
        """A host-tier sync of ``deployment`` ended (``complete``: it wrote every tensor): the
        rollout group's engine copy is stale, so its next generate of the deployment reloads from
        the StateManager (a switch, counted and estimated like any other). Returns the error of a
        rollout rank that could not take the change (the sync then fails), else None."""
        group = self.groups.get(rollout)
        if group is None or rollout in self.lost:
            return None  # it runs nothing more: the engine replaces it, and the deployment with it
        self.core.evicted(rollout, deployment)
        outcomes = await asyncio.gather(*(r.weights_changed.remote(list(deployment), complete) for r in group.ranks),
                                        return_exceptions=True)
        error = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if error is None:
            return None
        # the rollout engine may still hold the old weights: the sync must not count as done
        return EngineFault(f"sync_weights of {'/'.join(deployment)}: {rollout} could not take the new weights "
                           f"({fault_reason(error)})")

    def pause(self, job: str) -> None:
        self.core.pause(job)

    def resume(self, job: str) -> None:
        self.core.resume(job)
        self._pump()

    def set_weight(self, tenant: str, weight: float) -> None:
        self.core.set_weight(tenant, weight)

    def set_priority(self, job: str, factor: float) -> None:
        self.core.set_priority(job, factor)

    def set_budget(self, tenant: str, device_seconds: float | None) -> float | None:
        """The tenant's device-seconds left (None: no limit); a raised one lets its calls start.
        Returns what was left before (None: no limit), read and replaced in one step."""
        return self.set_tenant(tenant, None, device_seconds)[0]

    def set_tenant(self, tenant: str, weight: float | None, device_seconds: float | None) -> tuple[float | None, float]:
        """The tenant's weight (None: unchanged) and device-seconds left (None: no limit), in one
        step. Returns the budget left before (None: no limit) and this clock's time of the change
        (that of the usage records: the calls ending after it spend the new budget)."""
        before = self.core.budget_left(tenant)
        if weight is not None:
            self.core.set_weight(tenant, weight)
        self.core.set_budget(tenant, device_seconds)
        self._pump()
        return before, self._now()

    def budget_left(self, tenant: str) -> float | None:
        return self.core.budget_left(tenant)

    def tenant(self, tenant: str) -> dict[str, float | None]:
        """``{"weight", "budget"}``: the tenant's weight and device-seconds left (None: no limit)."""
        return {"weight": self.core.weights.get(tenant, 1.0), "budget": self.core.budget_left(tenant)}

    def priority(self, job: str) -> float:
        return self.core.priorities.get(job, 1.0)

    def forget(self, job: str) -> None:
        self.core.forget(job)

    def abandon(self, job: str) -> int:
        """The job's driver is gone: its queued calls are dropped (their callers, if any still
        wait, get ``EngineFault``); calls already running finish. Returns how many were dropped."""
        dropped = self.core.abandon(job)
        for call_id in dropped:
            done, _ = self._waiting.pop(call_id, (None, None))
            if done is not None and not done.done():
                done.set_exception(EngineFault(f"{job}'s driver was replaced; call dropped"))
        self._pump()
        return len(dropped)

    def lost_groups(self) -> dict[str, str]:
        """Worker groups that lost a rank (name -> what happened), until ``add_groups`` replaces them."""
        return dict(self.lost)

    def stats(self) -> dict[str, Any]:
        return {
            "queued": len(self.core.queue),
            "running": len(self.core.running),
            "switches": self.switches,
            "switch_seconds": self.switch_seconds,
            "prefetches": self.prefetches,
            "socket_calls": self.socket_calls,
            "estimates": {f"{j}/{fn}": v for (j, fn), v in self.core.estimates.items()},
            # jobs whose state the scheduler last put on each WPG's devices (least recently used first)
            "resident": {name: list(dict.fromkeys(job for job, _ in w.resident)) for name, w in self.core.wpgs.items()},
        }


def scheduler_service(groups: list[Any] | None = None, policy: Policy | None = None, *,
                      tenants: dict[str, dict[str, float | None]] | None = None,
                      priorities: dict[str, float] | None = None):
    """The engine's scheduler actor, with ``groups`` registered. Started on first use, on the
    caller's node, with ``policy``, ``tenants`` and ``priorities`` (see ``SchedulerService``); a
    running one is returned as it is."""
    from engine.support.local_node import here

    # on the caller's node (the engine service's, or a driver's beside it): the control plane
    handle = SchedulerService.options(name=SCHEDULER_NAME, lifetime="detached", get_if_exists=True,
                                      scheduling_strategy=here()).remote(policy, tenants, priorities)
    if groups:
        ray.get(handle.add_groups.remote(list(groups)))
    return handle


def stop_scheduler() -> None:
    try:
        handle = ray.get_actor(SCHEDULER_NAME)
    except ValueError:  # none running
        return
    with contextlib.suppress(Exception):  # a dead one cannot remove its socket; the next one will
        ray.get(handle.close.remote(), timeout=10)
    ray.kill(handle)


async def _run_on(ranks: list, request: Any) -> list:
    """Each rank's ``run(request)``: its result, or the exception it raised. When a rank of a
    multi-rank group dies, the others are killed: they would wait forever in a collective
    operation for the dead one (the group is lost either way; the engine starts a new one)."""
    if len(ranks) == 1:  # most WPGs: awaited directly, without a task per rank
        try:
            return [await ranks[0].run.remote(request)]
        except Exception as exc:
            return [exc]
    futures = [asyncio.ensure_future(_outcome(rank.run.remote(request))) for rank in ranks]
    pending, stopped = set(futures), set()
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if any(_died(f.result()) for f in done) and pending and not stopped:
            stopped = {futures.index(f) for f in pending}
            for i in stopped:
                with contextlib.suppress(Exception):
                    ray.kill(ranks[i], no_restart=True)
    # the ranks stopped here did not die of themselves: only the one that did is reported as dead
    return [EngineFault(f"rank {i} stopped with its group") if i in stopped else f.result()
            for i, f in enumerate(futures)]


def _died(outcome: Any) -> bool:
    """Whether a rank's outcome says the rank itself died (not that a call it made failed)."""
    return isinstance(outcome, RayActorError) and not isinstance(outcome, RayTaskError)


async def _outcome(ref) -> Any:
    try:
        return await ref
    except Exception as exc:
        return exc
