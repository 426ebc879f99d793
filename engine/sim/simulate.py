"""The discrete-event simulator: the same jobs under five deployment modes, on a virtual clock.

Dedicated modes (a job holds its devices from start to end; the cluster admits jobs first come,
first served, when enough devices are free):

- ``isolated_split``: rollout and train devices apart, synchronous steps (rollout, reward, log-probs,
  training, weight sync one after another);
- ``async_split``: the same devices, one step off-policy: rollout of step k+1 overlaps training of
  step k, the weight sync joins both sides;
- ``colocated``: one group of rollout + train devices runs both phases on the training layout
  (inference at ``colocated_efficiency`` per device, training over all devices).

Shared modes run the placement and admission policy (``engine.scheduler.admission.Placer``) and
the scheduler core (``engine.scheduler.core.Scheduler``) unchanged, as the live engine does. The
cluster's node groups form *domains* (the fewest whole node groups that hold the largest job), each
under one scheduler core; WPGs are formed on a domain's free devices as placement needs them (any
model class on any domain: a WPG hosts one class, its affinity) and released when their last job
leaves. A job is profiled for its first steps, then placed by its measured demand (a micro-shift
onto the WPGs whose idle time it fills best while jobs wait; onto fresh WPGs of its own while none
does), within a per-job slowdown bound. Its calls go through its domain's queues in HRRS order;
prefetch hints overlap a swap with the running call, and a dirty train state is written back behind
the next call (write-behind), so a switch costs its read. Users pay for the calls they ran (usage
records from the core, as live billing does); the provider holds the WPGs from their forming to
their release (``held_device_s``).

- ``plexrl``: waiting jobs start in arrival order, the first that does not fit holds the rest;
- ``plexrl_backfill``: a later job that fits starts while an earlier one waits (a job passed over
  too often reserves a domain, so none waits forever).

Weight syncs (``sync``, the live engine's rule, ``engine.scheduler.placement.sync_mode``): ``host``
(the default) holds the job's train WPG only, whose ranks write the new weights to the host tier of
each rollout WPG's node, the rollout WPGs reloading them from there before the job's next generate;
a job with a rollout WPG over several nodes syncs ``gang`` regardless, holding its train WPG and
every rollout WPG at once (``gang`` asks that of every job).

``run_pools`` keeps the fixed pools of earlier versions for ``--from-bench``: a bench's one rollout
and one train group.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.accounting.metering import UsageRecord, device_seconds
from engine.scheduler.admission import AdmissionPolicy, Demand, Domain, JobShape, Placement, Placer, Slot, StepProfile
from engine.scheduler.core import STEP, Deployment, Dispatch, Policy, Prefetch, Scheduler
from engine.scheduler.placement import SYNCS, assign_wpgs, check_sync, sync_mode
from engine.sim.workload import ModelClass, StepPlan, Workload, isolated_step_mean_s
from engine.support.collector import collector_paused

MODES = ("isolated_split", "colocated", "async_split", "plexrl", "plexrl_backfill")
SHARED_MODES = ("plexrl", "plexrl_backfill")
ROLE = "policy"


@dataclass
class Busy:
    """Device-busy intervals (for utilisation over time): start, end, devices."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    devices: list[float] = field(default_factory=list)

    def add(self, start: float, end: float, devices: float) -> None:
        if end > start:
            self.starts.append(start)
            self.ends.append(end)
            self.devices.append(devices)

    def add_many(self, starts: np.ndarray, ends: np.ndarray, devices: float) -> None:
        self.starts.extend(starts.tolist())
        self.ends.extend(ends.tolist())
        self.devices.extend([devices] * len(starts))

    def series(self, edges: np.ndarray) -> np.ndarray:
        """Device-seconds busy in each bin between ``edges`` (exact: integrates the step function)."""
        if not self.starts:
            return np.zeros(len(edges) - 1)
        t = np.concatenate([np.asarray(self.starts), np.asarray(self.ends)])
        d = np.concatenate([np.asarray(self.devices), -np.asarray(self.devices)])
        order = np.argsort(t, kind="stable")
        t, rate = t[order], np.cumsum(d[order])
        # integral of the busy-devices step function from t[0] up to x
        areas = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(t))])
        idx = np.searchsorted(t, edges, side="right") - 1
        integral = np.where(idx < 0, 0.0, areas[np.maximum(idx, 0)] + rate[np.maximum(idx, 0)]
                            * (edges - t[np.maximum(idx, 0)]))
        return np.diff(integral)


@dataclass
class ModeResult:
    mode: str
    usage: list[UsageRecord]
    finish: dict[str, float]  # job -> completion time
    start: dict[str, float]  # job -> when it got devices
    busy: Busy  # devices computing
    wall_seconds: float = 0.0
    switches: int = 0
    switch_device_s: float = 0.0
    events: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # device-seconds the provider held (reservations or worker groups, idle included); None: what was
    # billed, as for the dedicated modes, whose bill is their reservations
    held_device_s: float | None = None


# --- dedicated deployments -------------------------------------------------------------------------


def _isolated_timeline(p: StepPlan, t0: float, busy: Busy) -> float:
    c = p.cls
    roll = p.rollout_phase_s()
    step = roll + p.reward_s + p.logprob_s + p.train_s + p.sync_s
    starts = t0 + np.concatenate([[0.0], np.cumsum(step)[:-1]])
    for r in range(p.replicas):
        busy.add_many(starts, starts + p.rollout_s[:, r], c.replica_gpus)
    lp0 = starts + roll + p.reward_s
    busy.add_many(lp0, lp0 + p.logprob_s + p.train_s, c.train_gpus)
    s0 = lp0 + p.logprob_s + p.train_s
    busy.add_many(s0, s0 + p.sync_s, c.rollout_gpus + c.train_gpus)
    return float(t0 + step.sum())


def _async_timeline(p: StepPlan, t0: float, busy: Busy) -> float:
    """One step off-policy: generation of step k + 1 overlaps training of step k. Generation of
    step k samples with the weights synced after step k - 2; the sync after step k joins both sides,
    so it waits for training k and for the rollout side to finish generating step k + 1."""
    c = p.cls
    n = len(p.sync_s)
    roll = p.rollout_phase_s()
    both = c.rollout_gpus + c.train_gpus
    gen_end = [0.0] * n
    train_end = [0.0] * n
    sync_end = [0.0] * n

    def synced(k: int) -> float:  # when the weights after step k are on the rollout side
        return t0 if k < 0 else sync_end[k]

    for k in range(n):
        gs = t0 if k == 0 else max(gen_end[k - 1], synced(k - 2))
        for r in range(p.replicas):
            busy.add(gs, gs + float(p.rollout_s[k, r]), c.replica_gpus)
        gen_end[k] = gs + float(roll[k] + p.reward_s[k])
        if k >= 1:
            ss = max(train_end[k - 1], gen_end[k])
            sync_end[k - 1] = ss + float(p.sync_s[k - 1])
            busy.add(ss, sync_end[k - 1], both)
        ts = max(gen_end[k], synced(k - 1))
        train_end[k] = ts + float(p.logprob_s[k] + p.train_s[k])
        busy.add(ts, train_end[k], c.train_gpus)
    sync_end[n - 1] = train_end[n - 1] + float(p.sync_s[n - 1])
    busy.add(train_end[n - 1], sync_end[n - 1], both)
    return sync_end[n - 1]


def colocated_switch_s(w: Workload, c: ModelClass) -> float:
    """Per phase change on a colocated group: the optimizer state out to host and back (seconds)."""
    return 2 * w.optimizer_bytes * c.params_b * 1e9 / ((c.rollout_gpus + c.train_gpus) * w.h2d_gb_s * 1e9)


def _colocated_timeline(w: Workload, p: StepPlan, t0: float, busy: Busy) -> float:
    c = p.cls
    devices = c.rollout_gpus + c.train_gpus
    train = (p.logprob_s + p.train_s) * c.train_gpus / devices  # data parallel over every device
    sync = p.sync_s  # a reshard within the group
    switch = colocated_switch_s(w, c)
    step = p.colocated_rollout_s + p.reward_s + train + sync + switch
    starts = t0 + np.concatenate([[0.0], np.cumsum(step)[:-1]])
    # busy at right-sized efficiency: the work the rollout did, not the devices it held
    busy.add_many(starts, starts + p.rollout_s.sum(axis=1) * c.replica_gpus / devices, devices)
    t1 = starts + p.colocated_rollout_s + p.reward_s
    busy.add_many(t1, t1 + train + sync, devices)
    return float(t0 + step.sum())


def run_dedicated(mode: str, w: Workload, plans: list[StepPlan], *,
                  on_done: Callable[[], None] | None = None) -> ModeResult:
    """First come, first served: a job starts when every job before it has started and its whole
    reservation is free."""
    busy = Busy()
    timeline: dict[str, Callable[[StepPlan, float], float]] = {
        "isolated_split": lambda p, t: _isolated_timeline(p, t, busy),
        "async_split": lambda p, t: _async_timeline(p, t, busy),
        "colocated": lambda p, t: _colocated_timeline(w, p, t, busy),
    }
    run = timeline[mode]
    free = w.gpus
    releases: list[tuple[float, int, int]] = []  # (end, seq, devices)
    usage, start, finish = [], {}, {}
    now = 0.0
    for i, p in enumerate(sorted(plans, key=lambda q: (q.job.arrival, q.job.id))):
        need = p.cls.rollout_gpus + p.cls.train_gpus
        if need > w.gpus:
            raise ValueError(f"job {p.job.id} needs {need} devices, the cluster has {w.gpus}")
        now = max(now, p.job.arrival)
        while releases and (free < need or releases[0][0] <= now):
            end, _, devices = heapq.heappop(releases)
            free += devices
            now = max(now, end)
        end = run(p, now)
        free -= need
        heapq.heappush(releases, (end, i, need))
        start[p.job.id], finish[p.job.id] = now, end
        if on_done:
            on_done()
        usage.append(UsageRecord(job=p.job.id, role="reservation", fn=mode, wpg=f"{p.job.id}/{mode}",
                                 devices=need, start=now, end=end))
    return ModeResult(mode, usage, finish, start, busy, events=2 * len(plans))


# --- shared deployments: the scheduler core on a virtual clock -------------------------------------


@dataclass
class PoolWpg:
    name: str
    kind: str  # "rollout" or "train"
    devices: int
    load: float = 0.0  # declared demand of the jobs placed on it (fraction of its time)


@dataclass(eq=False)
class Pool:
    """WPGs of one affinity class (they host only that class's jobs) under one scheduler core."""

    name: str
    cls: str
    scheduler: Scheduler
    rollout: list[PoolWpg]
    train: list[PoolWpg]


@dataclass(slots=True)
class CallSpec:
    """One call a job makes: ``target`` "train", "rollout" (its ``replica``-th rollout WPG) or
    "sync" (its train WPG and every rollout WPG it uses, at once). Slotted: every step of every
    job makes its own (not to be changed once made)."""

    fn: str
    target: str
    seconds: float
    replica: int = 0
    role: str = ROLE


# A stage of a step: calls run in parallel (each on a stream of its own), or host seconds (no WPG).
Stage = tuple[CallSpec, ...] | float


@dataclass(frozen=True)
class SimJob:
    """A job as the shared modes run it: where it may go, what it declares, what each step does."""

    id: str
    cls: str
    arrival: float
    steps: int
    replicas: int  # rollout WPGs it uses
    demand: tuple[float, float]  # declared fraction of each rollout and of the train WPG's time
    switch_s: dict[tuple[str, str], float]  # (role, "rollout" | "train") -> seconds to swap in there
    stages: Callable[[int], list[Stage]]  # step -> its stages


def declared_demand(w: Workload, c: ModelClass) -> tuple[float, float]:
    """Fractions of a rollout replica's and a train WPG's time a job of class ``c`` declares: its
    phase shares of the isolated step (the sync on both sides)."""
    s = w.shares
    step = isolated_step_mean_s(w, c)
    return ((s.rollout + s.sync) * c.step_s / step, (s.logprob + s.train + s.sync) * c.step_s / step)


def _capacity(w: Workload, c: ModelClass, kind: str, devices: int) -> int:
    """Job states a WPG holds at once: half a device's memory for states on rollout WPGs (the rest
    is KV cache), 70 % on train WPGs (the rest is activations); at least one."""
    if kind == "rollout":
        per_device = w.weight_bytes * c.params_b * 1e9 / devices
        room = 0.5
    else:
        per_device = (w.weight_bytes + w.optimizer_bytes) * c.params_b * 1e9 / devices
        room = 0.7
    return max(1, int(room * w.gpu_memory_gb * 1e9 // per_device))


def switch_s(w: Workload, c: ModelClass, kind: str, devices: int) -> float:
    """Seconds to swap a job's state into a WPG: its bytes per device at the host bandwidth times
    the StateManager's measured swap efficiency (``Workload.swap_efficiency``). Only the read is
    on the call's path: the dirty train state it replaces is written back behind it
    (write-behind, as the StateManager does), overlapping the call."""
    per_device = (w.weight_bytes if kind == "rollout" else w.weight_bytes + w.optimizer_bytes) * c.params_b / devices
    return per_device / (w.h2d_gb_s * w.swap_efficiency)


def make_pool(name: str, cls: str, policy: Policy, rollout: list[tuple[int, int]],
              train: list[tuple[int, int]]) -> Pool:
    """A pool of WPGs given as (devices, job states held at once) per rollout and train WPG."""
    sched = Scheduler(policy)
    wpgs: dict[str, list[PoolWpg]] = {"rollout": [], "train": []}
    for kind, specs in (("rollout", rollout), ("train", train)):
        for j, (devices, capacity) in enumerate(specs):
            g = PoolWpg(f"{name}/{kind[0]}{j}", kind, devices)
            sched.add_wpg(g.name, devices=devices, capacity=capacity, kind=kind)
            wpgs[kind].append(g)
    return Pool(name, cls, sched, wpgs["rollout"], wpgs["train"])


def workload_job(w: Workload, p: StepPlan) -> SimJob:
    """A planned job's steps as stages: a generate call per replica, the reward on the host, the
    log-prob pass, the training pass, the weight sync on both sides."""
    c = p.cls

    def stages(k: int) -> list[Stage]:
        return [tuple(CallSpec("generate", "rollout", float(p.rollout_s[k, r]), r) for r in range(p.replicas)),
                float(p.reward_s[k]),
                (CallSpec("forward", "train", float(p.logprob_s[k])),),
                (CallSpec("forward_backward", "train", float(p.train_s[k])),),
                (CallSpec("sync_weights", "sync", float(p.sync_s[k])),)]

    return SimJob(p.job.id, c.name, p.job.arrival, len(p.sync_s), p.replicas, declared_demand(w, c),
                  {(ROLE, "rollout"): switch_s(w, c, "rollout", c.replica_gpus),
                   (ROLE, "train"): switch_s(w, c, "train", c.train_gpus)}, stages)


@functools.cache
def _stream(i: int) -> str:
    """The stream of a stage's ``i``-th parallel call (the step marks go on ``s0``)."""
    return f"s{i}"


@dataclass(eq=False)
class _CpuTask:
    """Work on the shared CPUs (``PoolSimulation.cpus``): ``left`` seconds of it still to do, of
    ``work`` begun at ``begun``, wanting ``wants`` CPUs; event ``kind`` with ``data`` once done
    (``PoolSimulation.after_cpu``)."""

    left: float
    wants: int
    kind: str
    data: Any
    begun: float
    work: float
    version: int = 0  # of its "cpu" event due (a rate change makes its earlier ones stale)
    slowed: bool = False  # it ran on fewer CPUs than it wants at some time


@dataclass(eq=False)
class _Running:
    """A job in a pool: where its calls go and how far it got."""

    job: SimJob
    pool: Pool
    rollout: tuple[str, ...]
    train: str
    step: int = 0
    stages: list[Stage] = field(default_factory=list)
    stage: int = -1
    outstanding: int = 0
    sync: str = "gang"  # how its sync_weights runs where it is placed now (``placement.sync_mode``)


def sim_policy(w: Workload) -> Policy:
    """The scheduler's policy on this workload's time scale: the same rules, with the starvation
    bound and the longest start delay sized to steps of minutes rather than of seconds."""
    shortest = min(c.step_s for c in w.classes)
    return Policy(max_wait_s=shortest, default_exec_s=0.1 * shortest, max_start_delay_s=0.05 * shortest)


def run_pools(mode: str, pools: list[Pool], jobs: list[SimJob], *, admit_load: float = float("inf"),
              spread: bool = False, on_done: Callable[[], None] | None = None) -> ModeResult:
    """Run ``jobs`` on shared ``pools``: each arrives, waits until a pool of its class admits it
    (its declared demand keeps every WPG's load within ``admit_load``), then runs its steps' calls
    through the pool's scheduler core. ``spread``: admit into the pool that stays least loaded and
    let later jobs of other classes pass a job that waits (backfill); else first come, first
    served into the first pool that fits."""
    return PoolSimulation(mode, pools, admit_load=admit_load, spread=spread, on_done=on_done).run(jobs)


class PoolSimulation:
    """The discrete-event loop of the shared modes: an event heap on a virtual clock, the admission
    queue, the running jobs' stages, and each pool's scheduler core deciding its WPGs' calls."""

    def __init__(self, mode: str, pools: list[Pool], *, admit_load: float, spread: bool,
                 on_done: Callable[[], None] | None, cpus: float | None = None):
        self.mode, self.admit_load, self.spread, self.on_done = mode, admit_load, spread, on_done
        # None: a call or host stage takes its given seconds. Else the CPUs every WPG's calls and
        # every driver's host work share (a machine whose device slots are not devices of their
        # own): each running call and host stage wants one and is CPU work of its given seconds;
        # while more are wanted than there are, each gets cpus / wanted of what it wants
        # (processor sharing), so what runs slows down as others start and speeds up as they end
        self.cpus: float = cpus or 0.0  # 0: not shared
        self.cpu_wanted = 0
        self.cpu_tasks: dict[int, _CpuTask] = {}
        self.cpu_since = 0.0  # the CPU tasks' remaining work is counted up to then
        self.cpu_ids = itertools.count(1)
        self.by_class: dict[str, list[Pool]] = defaultdict(list)
        for pool in pools:
            self.by_class[pool.cls].append(pool)
        self.wpg_of = {g.name: g for pool in pools for g in pool.rollout + pool.train}
        self.heap: list[tuple[float, int, str, Any]] = []
        self.order = itertools.count(1)  # ties in time: first pushed, first out
        self.queue: deque[SimJob] = deque()
        self.running: dict[str, _Running] = {}
        # per pool: its submitted calls not yet started, id -> (job, execution seconds)
        self.calls: dict[str, dict[int, tuple[_Running, float]]] = {p.name: {} for p in pools}
        self.usage: list[UsageRecord] = []
        self.busy = Busy()
        self.start: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.switches = 0
        self.switch_ds = 0.0
        self.events = 0
        self.wakeups: dict[str, float] = {}

    def push(self, t: float, kind: str, data: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.order), kind, data))

    def run(self, jobs: list[SimJob]) -> ModeResult:
        for job in sorted(jobs, key=lambda j: (j.arrival, j.id)):
            self.check(job)
            self.push(job.arrival, "arrive", job)
        while self.heap:
            now, _, kind, data = heapq.heappop(self.heap)
            self.events += 1
            touched = self.handle(now, kind, data)
            for pool in (touched if len(touched) < 2 else dict.fromkeys(touched)):
                self.decide(pool, now)
        if self.waiting() or self.running:
            raise RuntimeError(f"{self.mode}: {self.waiting()} jobs never admitted, "
                               f"{len(self.running)} never finished")
        return ModeResult(self.mode, self.usage, self.finish, self.start, self.busy, switches=self.switches,
                          switch_device_s=self.switch_ds, events=self.events, held_device_s=self.held_device_s())

    def check(self, job: SimJob) -> None:
        """Refuse, before the run, a job no pool can host."""
        if not self.by_class[job.cls]:
            raise ValueError(f"no pool hosts class {job.cls}")

    def waiting(self) -> int:
        return len(self.queue)

    def held_device_s(self) -> float | None:
        """Device-seconds the pools held (None: not counted)."""
        return None

    def handle(self, now: float, kind: str, data: Any) -> list[Pool]:
        """Apply one event; returns the pools whose scheduler must decide again."""
        if kind == "arrive":
            self.queue.append(data)
            return self.admit(now)
        if kind == "cpu":  # CPU work done: what it was for happens now
            return self.cpu_done(now, data)
        if kind == "done":
            pool, call_id, r, exec_s, setup = data
            for rec in pool.scheduler.complete(call_id, now, exec_s=exec_s, setup_s=setup):
                self.usage.append(rec)
                self.switch_ds += rec.setup_s * rec.devices  # billed to the job as part of its call
                self.busy.add(rec.start + setup, rec.end, rec.devices)
            r.outstanding -= 1
            touched = [pool]
            if r.outstanding == 0:
                touched += self.next_stage(r, now)
            return touched
        if kind == "host":
            return self.next_stage(data, now)
        return [data]  # "wake": the pool's scheduler asked to decide again now

    def admit(self, now: float) -> list[Pool]:
        """Admit the waiting jobs that fit, in arrival order (with ``spread``, past a class that waits)."""
        touched = []
        blocked: set[str] = set()
        for job in list(self.queue):
            if job.cls in blocked or (blocked and not self.spread):
                if not self.spread:
                    break
                continue
            best = self._best_pool(job)
            if best is None:
                blocked.add(job.cls)
                continue
            self._start(job, *best, now)
            touched.append(best[0])
        return touched

    def _best_pool(self, job: SimJob) -> tuple[Pool, tuple[tuple[int, ...], int]] | None:
        """The pool (and its WPGs) that takes ``job`` with the lowest peak load, or the first that
        takes it without ``spread``; None if none does."""
        dr, dt = job.demand
        best = None
        for pool in self.by_class[job.cls]:
            pick = assign_wpgs([g.load for g in pool.rollout], [g.load for g in pool.train], job.replicas, dr, dt,
                               limit=self.admit_load)
            if pick is None:
                continue
            peak = max([pool.rollout[i].load + dr for i in pick[0]] + [pool.train[pick[1]].load + dt])
            if best is None or peak < best[0]:
                best = (peak, pool, pick)
            if not self.spread:
                break
        return None if best is None else (best[1], best[2])

    def _start(self, job: SimJob, pool: Pool, pick: tuple[tuple[int, ...], int], now: float) -> None:
        dr, dt = job.demand
        ri, ti = pick
        for i in ri:
            pool.rollout[i].load += dr
        pool.train[ti].load += dt
        self.queue.remove(job)
        r = _Running(job, pool, tuple(pool.rollout[i].name for i in ri), pool.train[ti].name)
        self.running[job.id] = r
        self.start[job.id] = now
        for (role, kind), seconds in job.switch_s.items():
            for name in (r.rollout if kind == "rollout" else (r.train,)):
                pool.scheduler.set_switch_cost((job.id, role), name, seconds)
        self.begin_step(r, now)

    def begin_step(self, r: _Running, now: float) -> None:
        r.pool.scheduler.submit(r.job.id, ROLE, STEP, (), now, stream="s0")
        r.stages = r.job.stages(r.step)
        r.stage = -1
        self.next_stage(r, now)

    def next_stage(self, r: _Running, now: float) -> list[Pool]:
        """Start the job's next stage (the next step's first one after its last)."""
        r.stage += 1
        if r.stage == len(r.stages):
            r.step += 1
            if r.step == r.job.steps:
                return self.end_job(r, now)
            self.begin_step(r, now)
            return [r.pool]
        stage = r.stages[r.stage]
        if isinstance(stage, float):
            self.after_cpu(now, stage, "host", r)
            return []
        submitted = self.calls[r.pool.name]
        for i, spec in enumerate(stage):
            wpgs = self.call_wpgs(r, spec)
            call = r.pool.scheduler.submit(r.job.id, spec.role, spec.fn, wpgs, now, stream=_stream(i))
            submitted[call.id] = (r, spec.seconds)
            r.outstanding += 1
        return [r.pool]

    def call_wpgs(self, r: _Running, spec: CallSpec) -> tuple[str, ...]:
        """The WPGs a call of ``r`` holds."""
        if spec.target == "train":
            return (r.train,)
        if spec.target == "rollout":
            return (r.rollout[spec.replica],)
        return (r.train, *r.rollout)

    def end_job(self, r: _Running, now: float) -> list[Pool]:
        r.pool.scheduler.forget(r.job.id)
        del self.running[r.job.id]
        self.finish[r.job.id] = now
        if self.on_done:
            self.on_done()
        return [r.pool, *self.left(r, now)]

    def left(self, r: _Running, now: float) -> list[Pool]:
        """The ended job leaves its WPGs; returns the pools of the jobs admitted then."""
        self.leave(r, now)
        return self.admit(now)

    def leave(self, r: _Running, now: float) -> None:
        """The ended job's load leaves its pool's WPGs."""
        dr, dt = r.job.demand
        for name in r.rollout:
            self.wpg_of[name].load -= dr
        self.wpg_of[r.train].load -= dt

    def decide(self, pool: Pool, now: float) -> None:
        sched = pool.scheduler
        waiting = self.calls[pool.name]
        for d in sched.decide(now):
            if not isinstance(d, Dispatch):
                self.hint(d, now)
                continue
            r, exec_s = waiting.pop(d.call.id)
            # the WPGs swap in parallel; the call holds all of its WPGs through the slowest swap
            setup = max(self.swap_s(sched, d, g, now) for g in d.switches) if d.switches else 0.0
            self.switches += len(d.switches)
            self.after_cpu(now, setup + exec_s, "done", (pool, d.call.id, r, exec_s, setup))
        wake = sched.next_wakeup(now) if sched.not_before else None
        if wake is not None and self.wakeups.get(pool.name) != wake:
            self.wakeups[pool.name] = wake
            self.push(wake, "wake", pool)

    def after_cpu(self, now: float, seconds: float, kind: str, data: Any, wants: int = 1) -> None:
        """Event ``kind`` with ``data`` once ``seconds`` of work wanting ``wants`` CPUs, begun now, is
        done: ``seconds`` later, or, where the CPUs are shared (``cpus``), once its share of them
        has done that work. A call's ("done") seconds are then the ones it took, in proportion."""
        if not self.cpus:
            self.push(now + seconds, kind, data)
            return
        self._cpu_advance(now)
        before = self._cpu_rate()
        task = self.cpu_tasks[next(self.cpu_ids)] = _CpuTask(seconds, wants, kind, data, now, seconds)
        self.cpu_wanted += wants
        self._cpu_reschedule(now, before, task)

    def _cpu_rate(self) -> float:
        """Work done per second by each CPU a task wants, now."""
        return min(1.0, self.cpus / self.cpu_wanted) if self.cpu_wanted else 1.0

    def _cpu_advance(self, now: float) -> None:
        """Count the work every CPU task did since ``cpu_since``."""
        rate = self._cpu_rate()
        done = (now - self.cpu_since) * rate
        if done > 0:
            for task in self.cpu_tasks.values():
                task.left -= done
                task.slowed = task.slowed or rate < 1.0
        self.cpu_since = now

    def _cpu_reschedule(self, now: float, before: float, new: _CpuTask | None = None) -> None:
        """Each task's "cpu" event at the rate now: every task's where the rate changed from
        ``before`` (their earlier events go stale), else only the ``new`` one's."""
        rate = self._cpu_rate()
        for key, task in self.cpu_tasks.items():
            if rate != before or task is new:
                task.version += 1
                self.push(now + max(0.0, task.left) / rate, "cpu", (key, task.version))

    def cpu_done(self, now: float, due: tuple[int, int]) -> list[Pool]:
        """A CPU task's work is done (unless its event went stale): its event happens now."""
        key, version = due
        task = self.cpu_tasks.get(key)
        if task is None or task.version != version:
            return []
        self._cpu_advance(now)
        before = self._cpu_rate()
        del self.cpu_tasks[key]
        self.cpu_wanted -= task.wants
        self._cpu_reschedule(now, before)
        data = task.data
        if task.kind == "done" and task.slowed:  # its execution and switch, as long as they took
            pool, call_id, r, exec_s, setup = data
            took = (now - task.begun) / task.work
            data = (pool, call_id, r, exec_s * took, setup * took)
        return self.handle(now, task.kind, data)

    def hint(self, hint: Prefetch, now: float) -> None:
        """A prefetch hint: fixed pools charge every swap in full at dispatch (none overlapped)."""

    def swap_s(self, sched: Scheduler, d: Dispatch, wpg: str, now: float) -> float:
        """Seconds ``d``'s call waits for its state to swap into ``wpg``."""
        return sched.switch_costs.get((d.call.deployment, wpg), 0.0)


class ClusterSimulation(PoolSimulation):
    """The shared modes on a whole cluster: the placer (``engine.scheduler.admission``) decides
    where and when each job runs and forms and releases WPGs on the domains' devices; one scheduler
    core per domain decides its WPGs' calls. Each finished step is reported to the placer (its
    pace, its profile, a micro-shift). Prefetch hints overlap a swap with the WPG's running call;
    a train state's write-back overlaps what follows (write-behind), so a switch costs its read.

    As the live service (``plexrl sim --from-bench``): ``form_s`` is a new WPG's start-up (an
    admission round's new WPGs start at once, and later rounds place jobs meanwhile, on them
    too), a job starts once all its WPGs are up, ``driver_s`` passes from then to its driver's
    first call, and ``leave_s`` from a job's end to its leaving its WPGs (released then if it
    leaves them empty)."""

    def __init__(self, mode: str, costs: ClassCosts, placer: Placer, *, sync: str = "host",
                 on_done: Callable[[], None] | None = None, form_s: float = 0.0, driver_s: float = 0.0,
                 cpus: float | None = None, leave_s: float = 0.0):
        self.placer, self.sync, self.form_s, self.driver_s = placer, check_sync(sync), form_s, driver_s
        self.leave_s = leave_s  # from a job's end until the service has noticed it and it leaves its WPGs
        self._starting: set[str] = set()  # WPGs starting (``form_s``)
        self._placed: list[_Running] = []  # jobs placed on WPGs not all up yet, in their order
        domains = [Pool(d, "*", Scheduler(costs.policy), [], []) for d in placer.domains]
        super().__init__(mode, domains, admit_load=placer.policy.limit, spread=True, on_done=on_done, cpus=cpus)
        self.domain = {p.name: p for p in domains}
        self.shapes, self.declared, self.step_s = costs.shapes, costs.declared, costs.step_s
        self.prefetched: dict[tuple[str, Deployment], float] = {}  # (wpg, deployment) -> when its swap began
        self.held_s = 0.0  # device-seconds of WPGs formed, idle or not
        self._held_since = 0.0
        self.held_peak = 0
        self.moves = 0
        self.migrations = 0  # moves whose train state crosses to other nodes
        self.migrate_s = costs.migrate_s
        self.jobs_by_id: dict[str, SimJob] = {}
        self.syncs = dict.fromkeys(SYNCS, 0)  # weight syncs run each way

    def check(self, job: SimJob) -> None:
        """The placer refuses, at its arrival, a job no domain could hold."""

    def waiting(self) -> int:
        return len(self.placer.waiting)

    def held_device_s(self) -> float | None:
        return self.held_s

    def handle(self, now: float, kind: str, data: Any) -> list[Pool]:
        if kind == "arrive":
            work = data.steps * self.step_s.get(data.cls, 0.0)  # its expected seconds alone
            self.placer.arrive(data.id, self.shapes[data.cls], self.declared[data.cls], now, work)
            self.jobs_by_id[data.id] = data
            return self.admit(now)
        if kind == "resume":
            self.begin_step(data, now)
            return [data.pool]
        if kind == "formed":  # a round's new WPGs are up: the jobs on WPGs all up start
            self._starting.difference_update(data)
            self._start_placed(now)
            return []
        if kind == "driver":  # its driver is up: its first step
            self.begin_step(data, now)
            return [data.pool]
        if kind == "left":
            return super().left(data, now)
        return super().handle(now, kind, data)

    def _held(self, now: float) -> None:
        """Count the held devices' time up to ``now`` (call before the WPGs change)."""
        held = self.placer.held_devices()
        self.held_s += held * (now - self._held_since)
        self._held_since = now

    def admit(self, now: float) -> list[Pool]:
        self._held(now)
        touched: list[Pool] = []
        fresh: list[str] = []
        for placement in self.placer.admit(now):
            job = self.jobs_by_id[placement.job]
            pool = self.domain[placement.domain]
            self._form(pool, placement)
            r = _Running(job, pool, placement.rollout, placement.train, sync=self._sync_of(placement))
            self.running[job.id] = r
            self.start[job.id] = now
            self._costs(r)
            if self.form_s:
                fresh += [slot.name for slot in placement.formed]
                self._placed.append(r)
            else:
                self._start_driver(r, now)
            touched.append(pool)
        if fresh:  # the round's new WPGs start at once, each wanting a CPU
            self._starting.update(fresh)
            self.after_cpu(now, self.form_s, "formed", fresh, wants=len(fresh))
        self._start_placed(now)
        self.held_peak = max(self.held_peak, self.placer.held_devices())
        return touched

    def left(self, r: _Running, now: float) -> list[Pool]:
        if not self.leave_s:
            return super().left(r, now)
        self.push(now + self.leave_s, "left", r)  # its WPGs hold its load (and devices) until then
        return []

    def _start_placed(self, now: float) -> None:
        """Start the placed jobs whose WPGs are all up."""
        if not self._placed:
            return
        ready = [r for r in self._placed if self._starting.isdisjoint((*r.rollout, r.train))]
        self._placed = [r for r in self._placed if not self._starting.isdisjoint((*r.rollout, r.train))]
        for r in ready:
            self._start_driver(r, now)

    def _start_driver(self, r: _Running, now: float) -> None:
        """Start ``r``'s driver (it wants a CPU while it starts), or its first step at once."""
        if not self.driver_s:
            self.begin_step(r, now)
            return
        self.after_cpu(now, self.driver_s, "driver", r)

    def _sync_of(self, placement: Placement) -> str:
        """The sync the live engine gives these WPGs (the same rule): through the host tier
        only where one node's StateManager serves them all, else gang."""
        nodes = [{node for node, _ in self.placer.slots[name].devices} for name in placement.rollout]
        return sync_mode(self.sync, trainer_swaps=True, rollout_swaps=True, rollout_kind="vllm", nodes=nodes)

    def _form(self, pool: Pool, placement: Placement) -> None:
        for slot in placement.formed:
            pool.scheduler.add_wpg(slot.name, devices=len(slot.devices), capacity=slot.capacity, kind=slot.kind)

    def _costs(self, r: _Running) -> None:
        r.pool.scheduler.set_partners(r.job.id, (*r.rollout, r.train))
        for (role, kind), seconds in r.job.switch_s.items():
            for name in (r.rollout if kind == "rollout" else (r.train,)):
                r.pool.scheduler.set_switch_cost((r.job.id, role), name, seconds)

    def call_wpgs(self, r: _Running, spec: CallSpec) -> tuple[str, ...]:
        """With ``sync="host"``, a weight sync holds the train WPG only: the trainer writes the new
        rollout weights to the host tier, and each rollout WPG streams them in before the job's
        next generate there (a swap, which a prefetch hint may overlap)."""
        if spec.target != "sync":
            return super().call_wpgs(r, spec)
        self.syncs[r.sync] += 1
        if r.sync != "host":
            return super().call_wpgs(r, spec)
        for name in r.rollout:
            r.pool.scheduler.evicted(name, (r.job.id, spec.role))
        return (r.train,)

    def _release(self, pool: Pool, slots: Iterable[Slot]) -> None:
        for slot in slots:
            pool.scheduler.remove_wpg(slot.name)

    def next_stage(self, r: _Running, now: float) -> list[Pool]:
        if r.stage + 1 == len(r.stages) and r.step + 1 < r.job.steps:
            return self._step_done(r, now)
        return super().next_stage(r, now)

    def _step_done(self, r: _Running, now: float) -> list[Pool]:
        """The job's step ended (not its last): report it; apply a move and an urgency change."""
        progress = self.placer.step_done(r.job.id, step_profile(r.stages, r.sync), now)
        touched = [r.pool]
        old = r.pool
        if progress.urgent is not None:
            factor = self.placer.policy.urgent_factor if progress.urgent else 1.0
            r.pool.scheduler.set_priority(r.job.id, factor)
        crossed = False
        if progress.move is not None:
            self._held(now)
            self.moves += 1
            crossed = self._nodes(r.train, progress.move.released) != self._nodes(progress.move.train)
            old.scheduler.forget(r.job.id)  # between steps: nothing of it is queued
            new = self.domain[progress.move.domain]
            self._form(new, progress.move)
            r.pool, r.rollout, r.train = new, progress.move.rollout, progress.move.train
            r.sync = self._sync_of(progress.move)
            self._costs(r)
            if self.placer.is_urgent(r.job.id):
                new.scheduler.set_priority(r.job.id, self.placer.policy.urgent_factor)
            self._release(old, progress.move.released)
            touched.append(new)
        if progress.move is not None or progress.urgent is not None:
            touched += self.admit(now)
        r.stage += 1
        r.step += 1
        if crossed:
            self.migrations += 1
            self.push(now + self.migrate_s[r.job.cls], "resume", r)  # its train state crosses nodes first
            return touched
        self.begin_step(r, now)
        return touched

    def _nodes(self, train: str, released: Iterable[Slot] = ()) -> tuple[str, frozenset[int]]:
        """The domain and nodes of train WPG ``train`` (formed, or among ``released``)."""
        slot = self.placer.slots.get(train) or next(s for s in released if s.name == train)
        return slot.domain, frozenset(node for node, _ in slot.devices)

    def leave(self, r: _Running, now: float) -> None:
        """The ended job leaves the placer; the WPGs it leaves empty are released."""
        self._held(now)
        self._release(r.pool, self.placer.finish(r.job.id))

    def hint(self, hint: Prefetch, now: float) -> None:
        self.prefetched[(hint.wpg, hint.deployment)] = now  # the swap starts behind the running call

    def swap_s(self, sched: Scheduler, d: Dispatch, wpg: str, now: float) -> float:
        """What is left of the swap: all of it, or less the time since its prefetch hint."""
        cost = super().swap_s(sched, d, wpg, now)
        began = self.prefetched.pop((wpg, d.call.deployment), None)
        return cost if began is None else max(0.0, cost - (now - began))


def step_profile(stages: list[Stage], sync: str = "gang") -> StepProfile:
    """A step's stages as the placer's profile: execution seconds per rollout replica, on the
    train side and on both sides, and seconds on the host. A weight sync runs on both sides when
    ``sync`` is "gang", on the train side alone when "host" (the rollout side's reload is a swap,
    not execution: the live aligner profiles a host-tier sync as training too)."""
    rollout: dict[int, float] = defaultdict(float)
    train = both = host = 0.0
    for stage in stages:
        if isinstance(stage, float):
            host += stage
            continue
        for spec in stage:
            if spec.target == "rollout":
                rollout[spec.replica] += spec.seconds
            elif spec.target == "train" or sync == "host":
                train += spec.seconds
            else:
                both += spec.seconds
    return StepProfile(tuple(rollout[k] for k in sorted(rollout)), train, both, host)


def migrate_s(w: Workload, c: ModelClass) -> float:
    """Seconds to move a job's state to other nodes (its train WPG's): its train state (weights and
    optimizer) through storage at the disk bandwidth of its train WPG's nodes (the rollout side is
    refilled by the next weight sync)."""
    nodes = max(1, c.train_gpus // w.node_gpus)
    return (w.weight_bytes + w.optimizer_bytes) * c.params_b * 1e9 / (nodes * w.disk_gb_s * 1e9)


@dataclass(frozen=True)
class ClassCosts:
    """What ``ClusterSimulation`` knows of each job class: its shape, declared demand, the seconds
    its state takes to cross to other nodes, its expected step time alone (if known: a job's
    expected work orders the placer's queue); and the scheduler cores' policy."""

    shapes: dict[str, JobShape]
    declared: dict[str, Demand]
    migrate_s: dict[str, float]
    policy: Policy
    step_s: dict[str, float] = field(default_factory=dict)


def workload_costs(w: Workload) -> ClassCosts:
    return ClassCosts({c.name: job_shape(w, c) for c in w.classes},
                      {c.name: Demand(*declared_demand(w, c)) for c in w.classes},
                      {c.name: migrate_s(w, c) for c in w.classes}, sim_policy(w),
                      {c.name: isolated_step_mean_s(w, c) for c in w.classes})


def job_shape(w: Workload, c: ModelClass) -> JobShape:
    return JobShape(c.name, c.rollout_gpus // c.replica_gpus, c.replica_gpus, c.train_gpus,
                    _capacity(w, c, "rollout", c.replica_gpus), _capacity(w, c, "train", c.train_gpus))


def cluster_domains(w: Workload, groups_per_domain: int | None = None) -> list[Domain]:
    """The cluster's node groups in domains of ``groups_per_domain`` node groups (default: the
    fewest whole node groups that hold the largest job's WPGs; a job's WPGs lie in one domain)."""
    need = max(c.rollout_gpus + c.train_gpus for c in w.classes)
    per = groups_per_domain or max(1, math.ceil(need / w.group_gpus))
    groups = w.gpus // w.group_gpus
    count = max(1, groups // per)
    sizes = [per] * count
    sizes[-1] += groups - per * count  # a remainder joins the last domain
    return [Domain(f"d{i}", n * w.group_nodes, w.node_gpus) for i, n in enumerate(sizes)]


def sim_admission(w: Workload, mode: str, **overrides: Any) -> AdmissionPolicy:
    return AdmissionPolicy(**{"backfill": mode == "plexrl_backfill", **overrides})


def run_shared(mode: str, w: Workload, plans: list[StepPlan], *, admission: dict[str, Any] | None = None,
               on_done: Callable[[], None] | None = None) -> ModeResult:
    admission = dict(admission or {})
    groups = admission.pop("groups_per_domain", None)
    sync = admission.pop("sync", "host")
    policy = sim_admission(w, mode, **admission)
    placer = Placer(cluster_domains(w, groups), policy)
    sim = ClusterSimulation(mode, workload_costs(w), placer, sync=sync, on_done=on_done)
    result = sim.run([workload_job(w, p) for p in plans])
    result.extra = {"admission": dataclasses.asdict(policy), "sync": sync, "syncs": sim.syncs,
                    "domains": len(placer.domains),
                    "moves": sim.moves, "migrations": sim.migrations, "held_peak_devices": sim.held_peak}
    return result


def run_mode(mode: str, w: Workload, plans: list[StepPlan], **kwargs: Any) -> ModeResult:
    """Run one mode; ``on_done=f`` calls ``f()`` as each job completes (progress bars)."""
    t0 = time.perf_counter()
    with collector_paused():  # every call and usage record stays alive to the end of the mode
        if mode in ("isolated_split", "async_split", "colocated"):
            result = run_dedicated(mode, w, plans, **kwargs)
        elif mode in SHARED_MODES:
            result = run_shared(mode, w, plans, **kwargs)
        else:
            raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    result.wall_seconds = time.perf_counter() - t0
    return result


def summarise(result: ModeResult, plans: Iterable[StepPlan]) -> dict[str, Any]:
    plans = list(plans)
    arrivals = {p.job.id: p.job.arrival for p in plans}
    billed = device_seconds(result.usage)
    floor = sum(p.work_floor_device_s() for p in plans)
    first = min(arrivals.values())
    last = max(result.finish.values())
    jct = [result.finish[j] - arrivals[j] for j in arrivals]
    held = billed if result.held_device_s is None else result.held_device_s
    return {
        "device_hours": billed / 3600,
        "held_device_hours": held / 3600,
        "work_floor_device_hours": floor / 3600,
        "total_completion_s": last - first,
        "actual_over_peak": floor / billed if billed else 0.0,
        "held_actual_over_peak": floor / held if held else 0.0,
        "mean_job_completion_s": float(np.mean(jct)),
        "median_job_completion_s": float(np.median(jct)),
        "mean_queue_s": float(np.mean([result.start[j] - arrivals[j] for j in arrivals])),
        "switches": result.switches,
        "switch_device_hours": result.switch_device_s / 3600,
        "wall_seconds": result.wall_seconds,
        "events": result.events,
        "events_per_s": result.events / result.wall_seconds if result.wall_seconds else 0.0,
        **result.extra,
    }
