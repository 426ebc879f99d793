"""The scheduler's runtime core: queues of API calls per WPG, dispatched in HRRS order.

Pure and deterministic: every input (a call submitted, a call completed, a job paused, a switch
cost measured) comes in as an event carrying the time from an injected clock, and ``decide(now)``
returns what to run next. There is no Ray, no thread and no wall clock here; the live engine
(``engine.scheduler.live``) applies the decisions to worker groups, the simulator to its model.

Rules (docs/architecture.md §4):

- A WPG runs one call at a time (time-slicing at call granularity). A call may need several WPGs
  at once (``sync_weights`` from a training WPG into a rollout WPG): it gets all of them or waits.
- A job's calls run in the order it submitted them, one at a time: its next call becomes
  *eligible* when the previous one has completed, so sharing a WPG never reorders a job's work.
  The order is the caller's own numbering (``seq``), not arrival order: calls sent back to back
  may reach the scheduler out of order (a large batch takes longer to arrive than a small call
  behind it), and call ``seq`` waits until ``seq - 1`` has arrived and run. Each caller numbers
  its own *stream* of a job's calls (a restarted driver opens a new stream).
- Among eligible calls, the highest response ratio with setup goes first:
  ``weight * priority * (wait + exec + setup) / (exec + setup)``, where weight is the tenant's,
  priority the job's (``set_priority``: 0.5 low, 1 normal, 2 high), exec the job's online estimate
  for that function and setup the estimated switch cost on each WPG where the job's state is not
  resident. Ties: the call needing fewer switches, then the older call. With
  ``idle_partner_factor`` (1: off, the default), a call whose job's other WPGs (``set_partners``:
  its rollout and train WPGs) all run nothing has its ratio scaled by it: those WPGs idle until
  its job comes back to them, so the job whose other side waits on it goes first (the simulator's
  ``sim_wpg_shapes`` benchmark measures it; the README has what it gave).
- Fair share: tenants contending for a WPG get its time in proportion to their weights. Per
  (tenant, WPG) a virtual time counts the seconds the tenant's calls held the WPG over its weight
  (charged as calls complete). A call whose tenant's virtual time on one of its WPGs runs more than
  ``share_quantum_s`` ahead of the least among the tenants with calls that may start there ranks
  after every call within its share (the ratio orders each group), so the quantum is how far
  HRRS may favour a tenant (to save a switch, or for a long-waiting call) before the share
  applies. Idling banks no credit: each WPG keeps a clock, the least virtual time among the
  tenants contending there when it starts a call, and a tenant's virtual time is never let trail
  that clock by more than a quantum. Job priority reorders calls within a share, never the share.
  Tenant ``""`` (jobs outside the platform: the CLI, the simulator) is not share-accounted: its
  calls are ordered by HRRS alone, so with one tenant, or none, nothing changes.
- Starvation guard: a call that has waited ``max_wait_s`` is *overdue*; overdue calls go first,
  oldest first, and the WPGs an overdue call is waiting for are held for it (as in EASY
  backfilling), so a multi-WPG call cannot be starved by single-WPG ones either.
- Paused jobs' calls stay queued and are never dispatched or dropped; they run when resumed.
- Budgets: a tenant given one (device-seconds it may still use) has a call started if its
  estimated device-seconds fit in what is left, less the estimates of the tenant's calls running
  now; or, as its last call, if some budget is left and none of its calls runs. Each completed
  call is charged what it held. Calls that may not start stay queued, as a paused job's do, and
  run when the budget is raised. So the overrun is at most one call, plus what the calls running
  near the end took beyond their estimates.
- After each dispatch, the WPG's next likely call (its best remaining eligible call) is announced
  with a ``Prefetch`` when that job's state is not resident, so the swap overlaps the running call.
- Step boundaries arrive as ``STEP`` marks in a job's stream. A new job is profiled for its first
  steps, then micro-shifted onto the WPGs' cyclic horizon; each later step may be held back by a
  small start delay to keep it on its phase (``engine.scheduler.alignment``).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from engine.accounting.metering import UsageRecord
from engine.scheduler.alignment import Aligner

Deployment = tuple[str, str]  # (job, role)

EXEC_FLOOR_S = 1e-3  # estimates below this would make ratios explode; no call is that cheap to run
STEP = "step"  # a mark in a job's stream: its next step starts here (no WPG; never dispatched)


@dataclass(frozen=True)
class Policy:
    max_wait_s: float = 120.0  # a call that has waited this long goes first (starvation guard)
    default_exec_s: float = 0.5  # estimate for a function nobody has run yet
    default_setup_s: float = 0.05  # switch-cost estimate before one was measured for the job
    ema_alpha: float = 0.3  # weight of the newest measurement in the online exec estimate
    profile_steps: int = 2  # whole steps a new job runs as it comes before it is micro-shifted
    max_start_delay_s: float = 1.0  # the most a step is held back to keep its job on its phase
    offset_steps: int = 20  # phase offsets micro-shift tries per period
    share_quantum_s: float = 1.0  # how far (WPG seconds over weight) a tenant may run ahead of its share
    idle_partner_factor: float = 1.0  # on a call's ratio while its job's other WPGs (``set_partners``) all idle


@dataclass(slots=True)
class Call:
    """Not to be changed once made. Slotted dataclasses, not frozen, here and for ``Dispatch``: the
    simulator makes millions, and a frozen dataclass is made several times slower; a slotted class
    is made and read faster than a named tuple, from the sources and compiled (``make native``)."""

    id: int  # submission order, scheduler-wide
    job: str
    role: str
    fn: str
    wpgs: tuple[str, ...]  # every WPG the call occupies; the first one executes it
    submitted: float
    tenant: str = ""
    stream: tuple[str, str] = ("", "")  # (job, caller's stream id): calls of a stream run in seq order
    seq: int = 0

    @property
    def deployment(self) -> Deployment:
        return (self.job, self.role)


@dataclass(slots=True)
class Dispatch:
    call: Call
    at: float
    setup_s: float  # estimated switch seconds (0 when the state is resident on every WPG)
    switches: tuple[str, ...]  # WPGs that will swap the deployment in first
    queued_s: float = 0.0  # how long it waited, ready to run (its stream's earlier calls done), for WPGs


@dataclass(frozen=True)
class Prefetch:
    wpg: str
    deployment: Deployment


@dataclass
class Wpg:
    """A worker group as the scheduler sees it: its devices and which deployments are resident
    (least recently used first). ``capacity`` 0: it holds every deployment (no swapping)."""

    name: str
    devices: float = 1.0
    capacity: int = 0
    resident: OrderedDict[Deployment, None] = field(default_factory=OrderedDict)
    running: int | None = None  # id of the call it executes now
    kind: str = "both"  # the phases it runs, for alignment

    def is_resident(self, deployment: Deployment) -> bool:
        return self.capacity == 0 or deployment in self.resident

    def touch(self, deployment: Deployment) -> None:
        """The deployment runs here now: resident, most recently used; the LRU one leaves if full."""
        self.resident[deployment] = None
        self.resident.move_to_end(deployment)
        while self.capacity and len(self.resident) > self.capacity:
            self.resident.popitem(last=False)


class ExecEstimates:
    """Online per-job, per-function execution-time estimates (exponential moving average).

    A job's first call of a function is estimated from other jobs' calls of that function (their
    mean estimate), else from the policy default."""

    def __init__(self, alpha: float, default_s: float):
        self.alpha, self.default_s = alpha, default_s
        self._by_job: dict[tuple[str, str], float] = {}

    def observe(self, job: str, fn: str, seconds: float) -> None:
        key = (job, fn)
        old = self._by_job.get(key)
        self._by_job[key] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds

    def get(self, job: str, fn: str) -> float:
        value = self._by_job.get((job, fn))
        if value is None:
            others = [v for (_, f), v in self._by_job.items() if f == fn]
            value = sum(others) / len(others) if others else self.default_s
        return max(EXEC_FLOOR_S, value)

    def items(self) -> list[tuple[tuple[str, str], float]]:
        """Every estimate: ((job, function), seconds)."""
        return list(self._by_job.items())

    def known(self, job: str) -> dict[str, float]:
        return {fn: v for (j, fn), v in self._by_job.items() if j == job}

    def forget(self, job: str) -> None:
        for key in [k for k in self._by_job if k[0] == job]:
            del self._by_job[key]


def hrrs_ratio(wait_s: float, exec_s: float, setup_s: float, weight: float = 1.0) -> float:
    """Highest response ratio with setup: (wait + exec + setup) / (exec + setup), times the weight
    (the tenant's weight times the job's priority)."""
    service = max(EXEC_FLOOR_S, exec_s + setup_s)
    return weight * (wait_s + service) / service


class Scheduler:
    """Queues, residency and estimates of a set of WPGs; ``decide`` says what runs next."""

    def __init__(self, policy: Policy | None = None):
        self.policy = policy or Policy()
        self.wpgs: dict[str, Wpg] = {}
        self.estimates = ExecEstimates(self.policy.ema_alpha, self.policy.default_exec_s)
        self.queue: dict[int, Call] = {}  # submitted, not dispatched
        self.running: dict[int, Dispatch] = {}
        self.paused: set[str] = set()
        self.weights: dict[str, float] = {}  # tenant -> weight (default 1)
        self.priorities: dict[str, float] = {}  # job -> priority factor (default 1)
        self.vtime: dict[tuple[str, str], float] = {}  # (tenant, WPG) -> seconds held there / weight
        self.vclock: dict[str, float] = {}  # WPG -> least virtual time contending when it last started a call
        self._share_min: dict[str, float] = {}  # WPG -> least virtual time among this decision's candidates
        self.budgets: dict[str, float] = {}  # tenant -> device-seconds it may still use (absent: no limit)
        self._reserved: dict[str, float] = {}  # tenant -> estimated device-seconds of its running calls
        self._estimated: dict[int, float] = {}  # running call id -> its estimated device-seconds
        self.switch_costs: dict[tuple[Deployment, str], float] = {}  # (deployment, wpg) -> seconds
        # per stream: the next seq to run, and the stream's calls not yet completed by seq
        self._next_seq: dict[tuple[str, str], int] = {}
        self._pending: dict[tuple[str, str], dict[int, int]] = {}  # stream -> {seq: call id}
        self._ready: dict[tuple[str, str], int] = {}  # stream -> its next call's id, while that one is queued
        self._ready_at: dict[int, float] = {}  # call id -> when it became the next of its stream
        # the same calls indexed for ``decide``, which then looks only at those that may start: step
        # marks; the others by each WPG they need; and by age, for the ones that became overdue
        self._ready_marks: dict[int, Call] = {}
        self._ready_on: dict[str, dict[int, Call]] = {}  # WPG -> ready calls that need it
        self._by_age: list[tuple[float, int]] = []  # heap of (submitted, id); entries of calls gone are skipped
        self._overdue: dict[int, Call] = {}  # ready calls found overdue (re-checked against each decision's now)
        # ready calls that may have every WPG free: made ready, or a WPG of theirs freed, since the
        # last decision, or all free then and not started (held, paused, delayed, out of budget)
        self._maybe: dict[int, Call] = {}
        self._free: set[str] = set()  # WPGs running nothing
        self._next_id = 1
        self.aligner = Aligner(profile_steps=self.policy.profile_steps, max_delay_s=self.policy.max_start_delay_s,
                               offset_steps=self.policy.offset_steps)
        self.not_before: dict[str, float] = {}  # job -> when its held-back step may start
        self.partners: dict[str, tuple[str, ...]] = {}  # job -> every WPG it runs on (``set_partners``)

    # -- inputs ---------------------------------------------------------------------------------
    def add_wpg(self, name: str, *, devices: float = 1.0, capacity: int = 0, kind: str = "both") -> None:
        """``kind``: which phases the WPG runs ("rollout", "train" or "both"), for alignment."""
        if name not in self.wpgs:
            self.wpgs[name] = Wpg(name, devices, capacity, kind=kind)
            self._free.add(name)
            self.aligner.add_wpg(kind)

    def remove_wpg(self, name: str) -> None:
        """The WPG is gone (released when its last job left): it must run and await no call."""
        wpg = self.wpgs[name]
        if wpg.running is not None or any(name in c.wpgs for c in self.queue.values()):
            raise ValueError(f"WPG {name!r} still has calls running or queued")
        del self.wpgs[name]
        self.aligner.remove_wpg(wpg.kind)
        self._free.discard(name)
        self.vclock.pop(name, None)
        for share in [k for k in self.vtime if k[1] == name]:
            del self.vtime[share]
        for cost in [k for k in self.switch_costs if k[1] == name]:
            del self.switch_costs[cost]

    def submit(self, job: str, role: str, fn: str, wpgs: tuple[str, ...] | list[str], now: float,
               tenant: str = "", *, stream: str = "", seq: int | None = None) -> Call:
        """Queue a call. ``seq``: its number in the caller's ``stream`` of this job's calls
        (0, 1, 2, ...); omitted, calls of the stream are numbered in arrival order."""
        if not isinstance(wpgs, tuple):
            wpgs = tuple(wpgs)
        if (not wpgs and fn != STEP) or (wpgs and fn == STEP) or (len(wpgs) > 1 and len(set(wpgs)) != len(wpgs)):
            raise ValueError(f"a call needs one or more distinct WPGs (a {STEP} mark none), got {wpgs!r}")
        unknown = [w for w in wpgs if w not in self.wpgs]
        if unknown:
            raise KeyError(f"unknown WPG(s) {unknown}")
        key = (job, stream)
        pending = self._pending.get(key, {})
        first = self._next_seq.get(key, 0)
        if seq is None:
            seq = max(pending, default=first - 1) + 1
        if seq < first or seq in pending:
            raise ValueError(f"call {seq} of stream {key} was already submitted")
        call = Call(self._next_id, job, role, fn, wpgs, now, tenant, key, seq)
        self._next_id += 1
        self.queue[call.id] = call
        self._next_seq[key] = first
        self._pending[key] = pending  # only now: a rejected call must not leave an empty entry
        pending[seq] = call.id
        if seq == first:
            self._make_ready(call, now)
        return call

    def complete(self, call_id: int, now: float, *, exec_s: float | None = None,
                 setup_s: float = 0.0) -> list[UsageRecord]:
        """The call finished at ``now``; ``exec_s``: its measured execution time (without switch
        and queue wait), which feeds the job's estimate; ``setup_s``: measured switch seconds.
        Returns one usage record per WPG the call held."""
        dispatch = self.running.pop(call_id)
        call = dispatch.call
        self._retire(call, now)
        if exec_s is not None:
            self.estimates.observe(call.job, call.fn, exec_s)
        if self.aligner.profiling(call.job):  # a placed job's calls are not recorded: no lookups for them
            kinds = {self.wpgs[w].kind for w in call.wpgs if w in self.wpgs}
            self.aligner.record(call.job, call.fn, dispatch.at, now, "train" if kinds == {"train"} else None)
        records = []
        for name in call.wpgs:
            wpg = self.wpgs[name]
            wpg.running = None
            self._free.add(name)
            if waiting := self._ready_on.get(name):
                self._maybe.update(waiting)
            # positional: in UsageRecord's field order (the fastest way to make one; there are many)
            records.append(UsageRecord(call.job, call.role, call.fn, name, wpg.devices, dispatch.at, now, setup_s,
                                       exec_s, call_id, call.tenant, dispatch.queued_s))
        if (estimate := self._estimated.pop(call_id, None)) is not None:
            self._reserved[call.tenant] -= estimate
        if call.tenant in self.budgets:
            self.budgets[call.tenant] -= sum(record.device_seconds for record in records)
        if call.tenant:
            weight = self.weights.get(call.tenant, 1.0)
            for record in records:
                key = (call.tenant, record.wpg)
                self.vtime[key] = self.vtime.get(key, 0.0) + record.seconds / weight
        return records

    def pause(self, job: str) -> None:
        self.paused.add(job)

    def resume(self, job: str) -> None:
        self.paused.discard(job)

    def set_weight(self, tenant: str, weight: float) -> None:
        """``tenant``'s share of contended WPGs is in proportion to ``weight`` (default 1); the
        time its calls use from now on counts at this weight."""
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"a tenant weight must be a finite number > 0, got {weight!r}")
        self.weights[tenant] = float(weight)

    def set_priority(self, job: str, factor: float) -> None:
        """Scale the ratio of ``job``'s calls by ``factor`` (0.5 low, 1 normal, 2 high): it orders
        them within the tenant's share, and never widens the share."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"a job priority must be a finite number > 0, got {factor!r}")
        self.priorities[job] = float(factor)

    def set_partners(self, job: str, wpgs: tuple[str, ...]) -> None:
        """The WPGs ``job`` is placed on (its rollout and train WPGs). While every one of them that a
        call of it does not occupy runs nothing, the call's ratio is scaled by
        ``policy.idle_partner_factor``: its job holds those idle until the call is done."""
        self.partners[job] = tuple(wpgs)

    def set_budget(self, tenant: str, device_seconds: float | None) -> None:
        """From now on ``tenant`` may use ``device_seconds`` more (None: no limit); see Budgets."""
        if device_seconds is None:
            self.budgets.pop(tenant, None)
            return
        if not math.isfinite(device_seconds):
            raise ValueError(f"a budget must be a finite number of device-seconds, got {device_seconds!r}")
        self.budgets[tenant] = float(device_seconds)

    def budget_left(self, tenant: str) -> float | None:
        """Device-seconds ``tenant`` may still use (below zero: overrun); None without a budget."""
        return self.budgets.get(tenant)

    def _affordable(self, tenant: str, need: float = 0.0) -> bool:
        """Whether a call estimated at ``need`` device-seconds may start under the tenant's budget
        (0: whether any call might): it fits, or it is the last one (some budget is left, none of
        the tenant's calls runs)."""
        left = self.budgets.get(tenant)
        if left is None:
            return True
        reserved = self._reserved.get(tenant, 0.0)
        return left - reserved > 0 and (need <= left - reserved or not self._running_of(tenant))

    def _running_of(self, tenant: str) -> bool:
        return any(d.call.tenant == tenant for d in self.running.values())

    def _estimate_device_s(self, call: Call, setup_s: float) -> float:
        return (self.estimates.get(call.job, call.fn) + setup_s) * sum(self.wpgs[w].devices for w in call.wpgs)

    def set_switch_cost(self, deployment: Deployment, wpg: str, seconds: float) -> None:
        job, role = deployment  # a list, from JSON, as well
        self.switch_costs[((job, role), wpg)] = max(0.0, seconds)

    def evicted(self, wpg: str, deployment: Deployment) -> None:
        """The WPG no longer holds the deployment (dropped, or swapped out outside a call)."""
        job, role = deployment
        self.wpgs[wpg].resident.pop((job, role), None)

    # -- what the policy sees -------------------------------------------------------------------
    def eligible(self, now: float | None = None) -> list[Call]:
        """Calls that may start now: the next call of their stream (every earlier one completed),
        not running, of a job that is not paused (nor, given ``now``, held back by a start delay)."""
        out = []
        for key, head in self._ready.items():
            if key[0] in self.paused:
                continue
            if now is not None and self.not_before.get(key[0], now) > now:
                continue
            call = self.queue[head]
            if self.budgets and call.fn != STEP and not self._affordable(call.tenant):
                continue
            out.append(call)
        return out

    def _take_marks(self, now: float) -> None:
        """Consume the step marks at the head of their streams: each starts the job's next step."""
        while self._ready_marks and (marks := sorted(
                (c for c in self._ready_marks.values() if c.job not in self.paused), key=lambda c: c.id)):
            for call in marks:
                self._take(call)
                self._retire(call, now)
                delay = self.aligner.boundary(call.job, now)
                if delay > 0:
                    self.not_before[call.job] = now + delay
                else:
                    self.not_before.pop(call.job, None)

    def _take(self, call: Call) -> None:
        """``call`` leaves the queue (it starts, or it is a mark consumed)."""
        del self.queue[call.id]
        self._unready(call)

    def _make_ready(self, call: Call, now: float) -> None:
        """``call`` is queued and, from ``now``, the next of its stream."""
        self._ready[call.stream] = call.id
        self._ready_at[call.id] = now
        if call.fn == STEP:
            self._ready_marks[call.id] = call
            return
        for w in call.wpgs:
            self._ready_on.setdefault(w, {})[call.id] = call
        self._maybe[call.id] = call
        heapq.heappush(self._by_age, (call.submitted, call.id))

    def _unready(self, call: Call) -> None:
        """``call``, the next of its stream, leaves the queue (started, consumed or dropped)."""
        del self._ready[call.stream]
        del self._ready_at[call.id]
        if call.fn == STEP:
            del self._ready_marks[call.id]
            return
        self._overdue.pop(call.id, None)
        self._maybe.pop(call.id, None)
        for w in call.wpgs:
            waiting = self._ready_on[w]
            del waiting[call.id]
            if not waiting:
                del self._ready_on[w]

    def _retire(self, call: Call, now: float) -> None:
        """``call`` is done: the next call of its stream may start."""
        pending = self._pending[call.stream]
        del pending[call.seq]
        self._next_seq[call.stream] = call.seq + 1
        if not pending:
            del self._pending[call.stream]
        elif (nxt := pending.get(call.seq + 1)) is not None:
            self._make_ready(self.queue[nxt], now)  # submitted already (out of order), queued since

    def next_wakeup(self, now: float) -> float | None:
        """When a held-back job's next call may start (None: nothing is held back)."""
        held = [t for t in self.not_before.values() if t > now]
        return min(held) if held else None

    def setup_estimate(self, call: Call) -> tuple[float, tuple[str, ...]]:
        """Estimated switch seconds of ``call`` and the WPGs where its state is not resident."""
        deployment = call.deployment
        switches = tuple(w for w in call.wpgs if not self.wpgs[w].is_resident(deployment))
        if not switches:
            return 0.0, switches
        seconds = sum((self.switch_costs.get((deployment, w), self.policy.default_setup_s) for w in switches), 0.0)
        return seconds, switches

    def ratio(self, call: Call, now: float, setup_s: float | None = None) -> float:
        """``call``'s HRRS ratio at ``now``; ``setup_s``: its setup estimate, when already known."""
        if setup_s is None:
            setup_s, _ = self.setup_estimate(call)
        return hrrs_ratio(now - call.submitted, self.estimates.get(call.job, call.fn), setup_s,
                          self.weights.get(call.tenant, 1.0) * self.priorities.get(call.job, 1.0))

    def _key(self, call: Call, now: float, setup: tuple[float, tuple[str, ...]],
             beyond: set[int] | frozenset[int] = frozenset()) -> tuple:
        """Sort key, best first: overdue calls oldest first, then calls within their tenant's
        share before those ``beyond`` it, then the highest ratio, then fewer switches, then the
        older call."""
        if now - call.submitted >= self.policy.max_wait_s:
            return (0, call.submitted, call.id)
        seconds, switches = setup
        ratio = self.ratio(call, now, seconds)
        if self.policy.idle_partner_factor != 1.0:
            others = [w for w in self.partners.get(call.job, ()) if w not in call.wpgs]
            if others and all(w in self._free for w in others):
                ratio *= self.policy.idle_partner_factor
        return (1, call.id in beyond, -ratio, len(switches), call.id)

    def _fair_share(self, candidates: list[Call]) -> set[int]:
        """The candidates whose tenant is past its share on one of their WPGs (see Fair share).

        First each contending tenant's virtual time there is brought up to a quantum behind the
        WPG's clock (time it idled is not owed to it); the least of them, per WPG, is kept for the
        dispatches to advance the clock. Linear in the candidates; none is past its share with
        fewer than two tenants contending for a WPG."""
        quantum = self.policy.share_quantum_s
        least: dict[str, float] = {}
        for call in candidates:
            if not call.tenant:
                continue
            for w in call.wpgs:
                key = (call.tenant, w)
                vt = self.vtime[key] = max(self.vtime.get(key, 0.0), self.vclock.get(w, 0.0) - quantum)
                if vt < least.get(w, math.inf):
                    least[w] = vt
        self._share_min = least
        if not least:
            return set()
        return {call.id for call in candidates if call.tenant and any(
            self.vtime[(call.tenant, w)] > least[w] + quantum for w in call.wpgs)}

    # -- the decision ---------------------------------------------------------------------------
    def decide(self, now: float) -> list[Dispatch | Prefetch]:
        """Start every call that can start now, best first; then one prefetch hint per WPG that
        just got work, for its next likely call.

        Only eligible calls whose WPGs are all free, and overdue ones (which hold the WPGs they
        wait for), can change what starts; the others are not ranked, nor even looked at (the
        decisions are the same as ranking every eligible call and skipping those that cannot
        start)."""
        decisions: list[Dispatch | Prefetch] = []
        held: set[str] = set()  # WPGs kept free for an overdue call that waits for others
        self._take_marks(now)
        if not self._free:
            return decisions  # nothing can start (and nothing started, so no hint is due)
        # whether each tenant with a budget may start a call, as the decision begins
        affordable = {t: self._affordable(t) for t in self.budgets} if self.budgets else {}
        # ranked before anything starts, so the WPGs free now are those the filter must see
        candidates = [c for c in self._startable(now) if self._eligible(c, now, affordable)]
        setups = {c.id: self.setup_estimate(c) for c in candidates}
        beyond = self._fair_share(candidates)
        started: list[str] = []
        if len(candidates) > 1:  # one alone needs no ranking: its WPGs are free or it waits
            candidates.sort(key=lambda c: self._key(c, now, setups[c.id], beyond))
        for call in candidates:
            if not all(self.wpgs[w].running is None and w not in held for w in call.wpgs):
                if now - call.submitted >= self.policy.max_wait_s:
                    held.update(call.wpgs)
                continue
            setup, switches = setups[call.id]  # still true: only other, free WPGs were touched
            if call.tenant in self.budgets:
                estimate = self._estimate_device_s(call, setup)
                if not self._affordable(call.tenant, estimate):  # it waits for budget
                    continue
                self._estimated[call.id] = estimate
                self._reserved[call.tenant] = self._reserved.get(call.tenant, 0.0) + estimate
            queued = now - self._ready_at[call.id]
            for w in call.wpgs:
                self.wpgs[w].running = call.id
                self.wpgs[w].touch(call.deployment)
                self._free.discard(w)
                if w in self._share_min:  # tenants contended here: the WPG's clock moves on
                    self.vclock[w] = max(self.vclock.get(w, 0.0), self._share_min[w])
            self._take(call)
            dispatch = Dispatch(call, now, setup, switches, queued)
            self.running[call.id] = dispatch
            decisions.append(dispatch)
            started.extend(call.wpgs)
        for name in started:
            # the WPG's next likely call: the best eligible one still queued that it executes
            waiting = [c for c in self._executes_on(name) if self._eligible(c, now, affordable)]
            if not waiting:
                continue
            nxt = min(waiting, key=lambda c: self._key(c, now, self.setup_estimate(c), beyond))
            if not self.wpgs[name].is_resident(nxt.deployment):
                decisions.append(Prefetch(name, nxt.deployment))
        return decisions

    def _startable(self, now: float) -> list[Call]:
        """Ready calls (not step marks) whose WPGs are all free now, and those overdue. The first
        are among ``_maybe``: a call's WPGs can only all be free if it became ready, or one of
        them was freed, since the last decision, or they all were free then."""
        free = self._free
        found = {call_id: call for call_id, call in self._maybe.items()
                 if (call.wpgs[0] in free if len(call.wpgs) == 1 else free.issuperset(call.wpgs))}
        self._maybe = dict(found)  # the others wait for a WPG of theirs to be freed
        cutoff = now - self.policy.max_wait_s
        ages = self._by_age
        while ages and ages[0][0] <= cutoff:
            _, call_id = heapq.heappop(ages)
            if call_id in self._ready_at:
                self._overdue[call_id] = self.queue[call_id]
        for call_id, call in self._overdue.items():
            if call.submitted <= cutoff:
                found[call_id] = call
        return list(found.values())

    def _executes_on(self, wpg: str) -> list[Call]:
        """Ready calls (not step marks) that ``wpg`` would execute (their first WPG)."""
        return [c for c in self._ready_on.get(wpg, {}).values() if c.wpgs[0] == wpg]

    def _eligible(self, call: Call, now: float, affordable: dict[str, bool]) -> bool:
        """Whether ready ``call`` may start now (as ``eligible(now)`` says, with the budgets as
        ``affordable`` recorded them)."""
        return (call.job not in self.paused and self.not_before.get(call.job, now) <= now
                and affordable.get(call.tenant, True))

    def abandon(self, job: str) -> list[int]:
        """The job's driver is gone (a new one will submit its calls afresh, in a new stream): drop
        the job's queued calls; its running calls finish as usual. Returns the ids dropped."""
        dropped = []
        for key in [k for k in self._pending if k[0] == job]:
            pending = self._pending[key]
            for seq, call_id in list(pending.items()):
                call = self.queue.pop(call_id, None)
                if call is None:
                    continue  # running
                if self._ready.get(key) == call_id:
                    self._unready(call)
                del pending[seq]
                dropped.append(call_id)
            if not pending:
                del self._pending[key]
        return dropped

    def reset_wpg(self, name: str) -> None:
        """The WPG was replaced by a new one (its ranks died): it holds no job's state."""
        self.wpgs[name].resident.clear()

    def forget(self, job: str) -> None:
        """The job has ended: drop its estimates and costs (it must have no calls left). Its states
        stay resident where they are until evicted, as they do on the WPGs themselves."""
        if any(key[0] == job for key in self._pending):
            raise ValueError(f"job {job!r} still has calls queued or running")
        for key in [k for k in self._next_seq if k[0] == job]:
            del self._next_seq[key]
        self.estimates.forget(job)
        self.aligner.forget(job)
        self.not_before.pop(job, None)
        self.paused.discard(job)
        self.priorities.pop(job, None)
        self.partners.pop(job, None)
        for cost in [k for k in self.switch_costs if k[0][0] == job]:
            del self.switch_costs[cost]
