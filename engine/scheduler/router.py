"""The router: turns an API call into a ``Request`` and queues it at the scheduler for its WPG.

It keeps no decision of its own: placement comes from the scheduler's policy
(``engine.scheduler.placement``) and is recorded in ``placement`` only so that later calls of the
same deployment find their groups (``{(job, role): Placement}``); when a call runs is the live
scheduler's decision (``engine.scheduler.live``). A policy split over a trainer and a rollout
group gets ``sync_weights`` through the rollout node's StateManager where both groups keep state in
one (the trainer group publishes, holding only itself; the rollout group reloads before its next generate),
else on the rollout group, told which trainer ranks to pull from, holding both groups while it runs.

Each call's usage records (metering) come back with its result and go to the caller's ``on_usage``
(the client writes them to the job's event log) exactly once, when the future is first resolved.

On the scheduler's node a router submits over the scheduler's Unix socket (one connection per
router; see ``engine.scheduler.live``), elsewhere, or once that connection broke, through the
scheduler actor. Either way the call is queued and run the same way, in the caller's order.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import socket
import threading
import uuid
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from engine.api import OptimizerConfig, Request
from engine.scheduler.live import scheduler_service
from engine.scheduler.placement import GroupView, Placement, check_sync, place_deployment, sync_mode
from engine.support.wire import Closed, connect, recv, send
from engine.workers.group import BULKY, CREATE, NOOP, PUBLISH_NODE, PUBLISH_TO, WorkerGroup

UsageSink = Callable[[list[dict[str, Any]]], None]


class Future:
    """The result of one API call, available later; ``result()`` waits for it. ``ref``: the
    scheduler actor's answer, or the future of the answer on the scheduler's socket."""

    _UNSET = object()

    def __init__(self, ref: ray.ObjectRef | concurrent.futures.Future, request: Request,
                 on_usage: UsageSink | None = None):
        self._ref = ref
        self.request = request
        self._on_usage = on_usage
        self._value: Any = self._UNSET

    def result(self, timeout: float | None = None) -> Any:
        if self._value is self._UNSET:
            if isinstance(self._ref, concurrent.futures.Future):
                try:
                    value, usage = self._ref.result(timeout)
                except concurrent.futures.TimeoutError:
                    raise GetTimeoutError(f"{self.request.fn} of {self.request.job} not done in {timeout} s") from None
            else:
                value, usage = ray.get(self._ref, timeout=timeout)
                if self.request.fn in BULKY:
                    value = ray.get(value[0], timeout=timeout)  # fetched from the rank, not via the scheduler
            if self._on_usage is not None:
                self._on_usage(usage)
            self._value = value
        return self._value

    def done(self) -> bool:
        if isinstance(self._ref, concurrent.futures.Future):
            return self._ref.done()
        ready, _ = ray.wait([self._ref], timeout=0)
        return bool(ready)


class _SchedulerSocket:
    """A router's connection to the scheduler's node socket. Calls are numbered; a reader thread
    hands each answer to its call's future (answers come as calls finish, in any order). When the
    connection breaks, every call waiting on it fails with ``Closed``."""

    def __init__(self, path: str):
        self._sock = connect(path)
        self._ids = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._broken: str | None = None
        threading.Thread(target=self._read, name="router-scheduler-socket", daemon=True).start()

    def submit(self, args: tuple) -> concurrent.futures.Future:
        """Send a ``SchedulerService.submit``; ``Closed`` (and the call was not made) when the
        connection is broken."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            call_id = next(self._ids)
            self._pending[call_id] = future
            self._send((call_id, "submit", args), call_id)
        return future

    def step(self, args: tuple) -> None:
        with self._lock:
            self._send((None, "step", args), None)

    def _send(self, message: tuple, call_id: int | None) -> None:
        if self._broken is None:
            try:
                send(self._sock, message)
                return
            except OSError as exc:
                self._broken = f"the scheduler's socket broke: {exc}"
        self._pending.pop(call_id, None)
        raise Closed(self._broken)

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = recv(self._sock)
            except Exception as exc:  # closed, or an answer that did not unpickle: nothing more can be read
                with self._lock:
                    self._broken = self._broken or f"the scheduler's socket broke: {exc}"
                    pending, self._pending = self._pending, {}
                for future in pending.values():
                    future.set_exception(Closed(self._broken))
                return
            with self._lock:
                future = self._pending.pop(call_id, None)
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def close(self) -> None:
        self._broken = self._broken or "the router was closed"
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # the reader thread wakes up and ends
        self._sock.close()


def _open_scheduler_socket(scheduler) -> _SchedulerSocket | None:
    """A connection to ``scheduler``'s socket if it serves one on this node, else None."""
    try:
        found = ray.get(scheduler.endpoint.remote())
    except Exception:  # an older or dying scheduler: the actor path works regardless
        return None
    if found is None or found[0] != ray.get_runtime_context().get_node_id():
        return None
    try:
        return _SchedulerSocket(found[1])
    except Closed:
        return None


class Router:
    """``sync``: how a split deployment's ``sync_weights`` runs where it can ("host": through the
    rollout node's StateManager, holding the trainer group only; "gang": holding both groups; see
    ``engine.scheduler.placement.sync_mode``)."""

    def __init__(self, groups: Sequence[WorkerGroup], *, tenant: str = "", sync: str = "host"):
        self.sync = check_sync(sync)
        self.groups = {g.name: g for g in groups}
        self.placement: dict[tuple[str, str], Placement] = {}
        self.scheduler = scheduler_service(list(groups))
        self.tenant = tenant
        # this router's calls of each job are numbered, so the scheduler runs them in this order
        self._stream = uuid.uuid4().hex
        self._seq: defaultdict[str, itertools.count] = defaultdict(itertools.count)
        self._socket = _open_scheduler_socket(self.scheduler)
        if self._socket is not None:
            weakref.finalize(self, self._socket.close)

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
            trainer = self.groups[placed.trainer]
            if self.sync_of(placed) == "host":
                # The trainer's ranks write the weights to the rollout node's StateManager; the
                # scheduler marks the rollout group's copy stale before the job's next call may start.
                payload = {**payload, PUBLISH_TO: group.name, PUBLISH_NODE: group.nodes[0]}
                wpgs = (trainer.name,)
            else:
                # The rollout ranks pull the trainer's shards while the call holds both groups; the
                # job's calls run in order, so the sync sees every optim_step submitted before it.
                payload = {**payload, "source": trainer.ranks}
                wpgs = (group.name, trainer.name)
        return self._submit(Request(job=job, role=role, fn=fn, payload=payload), wpgs, on_usage)

    def sync_of(self, placed: Placement) -> str:
        """How ``sync_weights`` runs for a split placement: "host" or "gang"."""
        trainer, rollout = self.groups[placed.trainer], self.groups[placed.rollout]
        return sync_mode(self.sync, trainer_swaps=trainer.max_resident > 0, rollout_swaps=rollout.max_resident > 0,
                         rollout_kind=rollout.kind.value, nodes=[rollout.nodes])

    def mark_step(self, job: str) -> None:
        """Tell the scheduler that ``job``'s next step starts after the calls made so far (it
        profiles the job's steps, then keeps them on their phase). Does not wait."""
        args = (job, self._stream, next(self._seq[job]))
        if self._socket is not None:
            try:
                return self._socket.step(args)
            except Closed:
                self._socket = None  # this router uses the actor from now on
        self.scheduler.step.remote(*args)

    def _submit(self, request: Request, wpgs: tuple[str, ...], on_usage: UsageSink | None) -> Future:
        seq = next(self._seq[request.job])
        if self._socket is not None:
            args = (request.job, request.role, request.fn, request, wpgs, self.tenant, self._stream, seq)
            try:
                return Future(self._socket.submit(args), request, on_usage)
            except Closed:
                self._socket = None  # this router uses the actor from now on
        body = [ray.put(request)] if request.fn in BULKY else request  # nested: passed on unread
        ref = self.scheduler.submit.remote(request.job, request.role, request.fn, body, wpgs, self.tenant,
                                           self._stream, seq)
        return Future(ref, request, on_usage)
