"""Where jobs run on a cluster, and when they may start: pure placement and admission.

The simulator runs this code now; the live engine's multi-node cluster runs the same ``Placer``.

Terms. A cluster is split into *domains*: the fewest whole node groups that hold the largest job's
worker groups (a job's WPGs all lie in one domain, since its ``sync_weights`` call holds its train
and rollout WPGs at once, and one scheduler core serves a domain). WPGs are not fixed pools: a WPG
is formed on a domain's free devices when a placement needs one (any affinity on any domain it
fits) and released when its last job leaves. A WPG hosts jobs of one *affinity* only (architecture,
size and layout: the key a job's shape names), each using a fraction of the WPG's time, its
*demand*; a WPG's *load* is the sum of its jobs' demands.

A job goes through two phases:

1. **Profile.** Admitted by its declared demand wherever it fits: while nobody else waits, spread
   (fresh WPGs first, then the least loaded), so it runs as alone; under a backlog, packed (the
   fullest WPGs that take it, fresh ones only for the rest). Its first ``profile_steps`` steps
   measure what it really uses (``measure_demand``: execution time per WPG over its step time
   alone; queue waits and switches are not in it, so a shared job profiles as well as a lone one).
2. **Place.** The measured demand replaces the declared one, and the job is re-placed by
   micro-shift: while jobs wait, onto the domain and WPGs whose idle time its demand fills best
   (the highest load they reach within ``limit``) if that releases WPGs of its own or its load
   breaks the limit. Later steps keep looking: while a job waits that fits nowhere, a job alone on
   one of its WPGs moves onto fuller WPGs that take it (no fresh ones) when that releases the WPG
   (consolidation, across domains: the simulator charges the state's move through storage, as for
   any move whose train WPG lies on other nodes); where the whole job cannot move (a WPG it shares
   is over the limit or closed), each side it is alone on (the train WPG, a replica's rollout WPG)
   joins the fullest other WPG of its domain that takes it, the rest staying (``gather``); while
   nobody waits, a job that shares a WPG moves onto fresh WPGs of its own (checked again only
   after WPGs were released), so it runs as alone again.

Admission goes through the waiting jobs each time room may have appeared: in arrival order, or, with
``order="longest"`` (the default), the longest expected work first (a job's ``work``: its expected
seconds alone, given at its arrival), aged: a job ranks by its arrival time less its work, so one
that has waited longer than another's extra work goes before it, and a job ranks ahead of every job
that arrives more than the longest expected work after it. Under a backlog the last jobs to start
set the total completion time; starting the long ones first leaves short ones to fill the end (the
longest-processing-time rule for makespan). With ``backfill``, a job that fits nowhere now does not
hold back the jobs ranked after it that fit; a job passed over ``max_passed`` times *reserves* the
domain with the most free devices (one reservation at a time), which takes no other job until it
starts, so no job waits forever. Without, the first job that does not fit holds every later one. A
job that could never fit (too large for any domain) is refused at arrival.

The slowdown bound: a WPG never takes jobs whose demands sum past ``limit``, and ``limit`` may not
exceed ``slowdown_bound`` (a WPG loaded to L needs L times its jobs' time alone). Each step a job
reports its pace (time since admission over its time alone for the steps done). A job whose pace
reaches ``slowdown_bound - margin`` becomes *urgent*: its calls are ranked first (``urgent_factor``
on its HRRS ratio) and, with ``close_urgent``, its WPGs take no new job until its pace is back under
``slowdown_bound - 2 * margin``.

Deterministic: every choice breaks ties by name; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobShape:
    """What a job needs: ``replicas`` distinct rollout WPGs of ``rollout_devices`` devices and one
    train WPG of ``train_devices``, of ``affinity``; a WPG of that affinity holds ``*_capacity``
    job states at once (which only sizes the WPGs the placer forms). ``train_affinity``, if given,
    is the train WPG's affinity instead (a trainer that hosts jobs of several rollout affinities)."""

    affinity: str
    replicas: int
    rollout_devices: int
    train_devices: int
    rollout_capacity: int = 1
    train_capacity: int = 1
    train_affinity: str = ""

    def devices(self, kind: str) -> int:
        return self.rollout_devices if kind == "rollout" else self.train_devices

    def affinity_of(self, kind: str) -> str:
        return (self.train_affinity or self.affinity) if kind == "train" else self.affinity

    def capacity(self, kind: str) -> int:
        return self.rollout_capacity if kind == "rollout" else self.train_capacity


@dataclass(frozen=True)
class Demand:
    """Fractions of a rollout WPG's and of the train WPG's time a job keeps busy running alone."""

    rollout: float
    train: float

    def of(self, kind: str) -> float:
        return self.rollout if kind == "rollout" else self.train


@dataclass(frozen=True)
class StepProfile:
    """One step as it ran: execution seconds on each rollout replica and on the train WPG (calls
    that hold both sides, ``sync_weights``, counted on both) and seconds the job spent off every
    WPG (reward, tool calls). Queue waits and switches are not in it."""

    rollout_s: tuple[float, ...]
    train_s: float
    both_s: float
    host_s: float

    @property
    def alone_s(self) -> float:
        """The step's time alone: its slowest replica, the host, the train side, the sync."""
        return max(self.rollout_s, default=0.0) + self.host_s + self.train_s + self.both_s


def measure_demand(steps: Sequence[StepProfile]) -> Demand:
    """A job's demand from its profiled steps: mean busy seconds per rollout replica, and on the
    train WPG, over its mean step time alone."""
    if not steps:
        raise ValueError("a demand is measured from at least one step")
    alone = sum(s.alone_s for s in steps)
    if alone <= 0:
        return Demand(0.0, 0.0)
    rollout = sum((sum(s.rollout_s) / max(1, len(s.rollout_s)) + s.both_s) for s in steps)
    train = sum(s.train_s + s.both_s for s in steps)
    return Demand(rollout / alone, train / alone)


ORDERS = ("arrival", "longest")  # in which order waiting jobs are tried


@dataclass(frozen=True)
class AdmissionPolicy:
    limit: float = 1.3  # most load a WPG takes (sum of its jobs' demands; above 1 it is contended)
    slowdown_bound: float = 1.5  # a job's time shared over its time alone, at most (about)
    margin: float = 0.1  # pace this far under the bound makes a job urgent
    urgent_factor: float = 16.0  # on an urgent job's HRRS ratio
    profile_steps: int = 2
    backfill: bool = True  # later jobs pass one that fits nowhere now
    max_passed: int = 64  # passed this often, a waiting job reserves a domain (one at a time)
    close_urgent: bool = True  # an urgent job's WPGs take no new job
    spread_alone: bool = True  # a job admitted while nobody else waits spreads (else it packs)
    # after admission, jobs are profiled, re-measured, moved and made urgent (phase 2 and later);
    # False: a job keeps its declared demand and its WPGs until it ends (the live engine today)
    adaptive: bool = True
    order: str = "longest"  # which waiting job is tried first: "arrival", or "longest" expected work
    # consolidation may move one side of a job (its train WPG, or a replica's) when the whole job
    # cannot move: each WPG it is alone on joins a fuller one of its domain
    gather: bool = True

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"invalid admission policy: order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        # a WPG loaded past the bound cannot keep its jobs within it: they need ``load`` x their time
        if not (0 < self.limit <= self.slowdown_bound and self.slowdown_bound >= 1
                and 0 <= 2 * self.margin < self.slowdown_bound
                and self.urgent_factor >= 1 and self.profile_steps >= 0 and self.max_passed >= 0):
            raise ValueError(f"invalid admission policy {self}")


@dataclass
class Slot:
    """A WPG the placer formed: where its devices are and which jobs use it, at what demand."""

    name: str
    domain: str
    kind: str
    affinity: str
    devices: tuple[tuple[int, int], ...]  # (node, device) within the domain
    capacity: int
    jobs: dict[str, float] = field(default_factory=dict)  # job -> its demand here (change it with put / drop)
    _load: float = field(default=0.0, init=False, repr=False)

    @property
    def load(self) -> float:
        """The sum of its jobs' demands (kept as they change: the placer reads it far more often)."""
        return self._load

    def put(self, job: str, demand: float) -> None:
        self.jobs[job] = demand
        self._load = sum(self.jobs.values())

    def drop(self, job: str) -> None:
        self.jobs.pop(job, None)
        self._load = sum(self.jobs.values())


@dataclass(frozen=True)
class Placement:
    """A decision: ``job`` runs on these WPGs of ``domain``; ``formed``: WPGs made for it (new
    names in ``rollout`` / ``train``); ``released``: WPGs it left that are now empty (a move);
    ``moved``: it ran elsewhere before."""

    job: str
    domain: str
    rollout: tuple[str, ...]
    train: str
    formed: tuple[Slot, ...] = ()
    released: tuple[Slot, ...] = ()
    moved: bool = False


class Domain:
    """Nodes of ``node_devices`` devices each; which are free."""

    def __init__(self, name: str, nodes: int, node_devices: int):
        self.name, self.node_devices = name, node_devices
        self.free: list[list[int]] = [list(range(node_devices)) for _ in range(nodes)]

    @property
    def devices(self) -> int:
        return len(self.free) * self.node_devices

    def free_devices(self) -> int:
        return sum(len(f) for f in self.free)

    def plan(self, sizes: Iterable[int]) -> list[tuple[tuple[int, int], ...]] | None:
        """Devices for WPGs of these sizes (largest first; whole free nodes for a WPG larger than
        a node, else the fullest node that holds it), without taking them; None if they do not fit."""
        free = [list(f) for f in self.free]
        out: dict[int, tuple[tuple[int, int], ...]] = {}
        order = sorted(range(len(sizes := list(sizes))), key=lambda i: (-sizes[i], i))
        for i in order:
            got = self._take(free, sizes[i])
            if got is None:
                return None
            out[i] = got
        return [out[i] for i in range(len(sizes))]

    def _take(self, free: list[list[int]], size: int) -> tuple[tuple[int, int], ...] | None:
        if size > self.node_devices:
            whole = [n for n, f in enumerate(free) if len(f) == self.node_devices]
            need = math.ceil(size / self.node_devices)
            if len(whole) < need:
                return None
            got = [(n, d) for n in whole[:need] for d in free[n]][:size]
        else:
            fits = [n for n, f in enumerate(free) if len(f) >= size]
            if not fits:
                return None
            n = min(fits, key=lambda k: (len(free[k]), k))
            got = [(n, d) for d in free[n][:size]]
        taken = set(got)
        for n in {n for n, _ in got}:
            free[n] = [d for d in free[n] if (n, d) not in taken]
        return tuple(got)

    def take(self, devices: Iterable[tuple[int, int]]) -> None:
        for n, d in devices:
            self.free[n].remove(d)

    def give_back(self, devices: Iterable[tuple[int, int]]) -> None:
        for n, d in devices:
            self.free[n].append(d)
            self.free[n].sort()


@dataclass
class _Job:
    name: str
    shape: JobShape
    demand: Demand
    arrival: float
    order: int
    work: float = 0.0  # expected seconds alone, as declared at arrival (0: unknown)
    passed: int = 0
    placed: Placement | None = None
    phase: str = "waiting"  # "waiting", "profile", "placed"
    steps: list[StepProfile] = field(default_factory=list)
    admitted: float = 0.0
    alone_s: float = 0.0  # time alone of its steps done since admission
    urgent: bool = False
    checked: int = -1  # releases counted when it last looked for fresh WPGs

    @property
    def where(self) -> Placement:
        """Where the admitted job runs."""
        assert self.placed is not None, f"job {self.name!r} is not placed"
        return self.placed


@dataclass(frozen=True)
class _Option:
    """A candidate placement in one domain: existing WPGs reused and sizes of fresh ones."""

    domain: str
    rollout: tuple[str | None, ...]  # an existing WPG, or None: a fresh one
    train: str | None
    devices: tuple[tuple[tuple[int, int], ...], ...]  # for the fresh ones, rollout first
    peak: float  # highest load a WPG it uses reaches
    fill: float  # mean load the WPGs it uses reach


@dataclass(frozen=True)
class Progress:
    """What a step report changed: the job's ``move`` (None: it stays) and its urgency (None: as
    before; True or False: changed to that)."""

    move: Placement | None = None
    urgent: bool | None = None


class Placer:
    """Waiting and running jobs, the WPGs formed for them, and the domains' free devices."""

    def __init__(self, domains: Sequence[Domain], policy: AdmissionPolicy | None = None):
        if not domains or len({d.name for d in domains}) != len(domains):
            raise ValueError("a cluster needs one or more domains with distinct names")
        self.policy = policy or AdmissionPolicy()
        self.domains = {d.name: d for d in domains}
        self.slots: dict[str, Slot] = {}
        self.jobs: dict[str, _Job] = {}
        self.waiting: list[str] = []  # arrival order
        self.reserved: dict[str, str] = {}  # domain -> the job it is kept for
        self._index: dict[tuple[str, str, str, int], dict[str, Slot]] = {}  # (domain, kind, affinity, devices)
        self._order = 0
        self._names = 0
        self._refused = False  # the last admission left a job waiting that fits nowhere
        self._released = 0  # WPGs released so far
        self._held = 0  # devices in formed WPGs

    # -- inputs -------------------------------------------------------------------------------
    def arrive(self, job: str, shape: JobShape, declared: Demand, now: float, work: float = 0.0) -> None:
        """A job asks for room, expecting to run ``work`` seconds alone (0: unknown; it orders the
        queue with ``order="longest"``); refused (ValueError) if no domain could ever hold it."""
        if job in self.jobs:
            raise ValueError(f"job {job!r} arrived already")
        if shape.replicas < 1 or min(shape.rollout_devices, shape.train_devices) < 1:
            raise ValueError(f"job {job!r}: a shape needs replicas and devices >= 1, got {shape}")
        sizes = [shape.rollout_devices] * shape.replicas + [shape.train_devices]
        if not any(Domain(d.name, len(d.free), d.node_devices).plan(sizes) for d in self.domains.values()):
            raise ValueError(f"job {job!r} needs {sum(sizes)} devices in WPGs of {sizes}: no domain can hold it")
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"job {job!r}: expected work must be a finite number of seconds >= 0, got {work}")
        self.jobs[job] = _Job(job, shape, declared, now, self._order, work=work)
        self._order += 1
        self.waiting.append(job)

    def queue(self) -> list[str]:
        """The waiting jobs in the order admission tries them."""
        if self.policy.order == "arrival":
            return list(self.waiting)
        return sorted(self.waiting, key=lambda n: (self.jobs[n].arrival - self.jobs[n].work, self.jobs[n].order))

    def admit(self, now: float) -> list[Placement]:
        """Start the waiting jobs that fit, in the policy's order (see the module's Admission)."""
        out: list[Placement] = []
        failed: set[tuple] = set()
        self._refused = False
        queue = self.queue()
        rank = {name: i for i, name in enumerate(queue)}
        for name in queue:
            job = self.jobs[name]
            key = (job.shape, job.demand, self._reservation_of(name))  # jobs alike fit alike
            if key in failed:
                continue
            # spread while nobody else waits (the job runs as alone); pack under a backlog
            option = self._best(job, job.demand, pack=len(self.waiting) > 1 or not self.policy.spread_alone)
            if option is None:
                self._refused = True
                if not self.policy.backfill:
                    break  # first come, first served: it holds every later job
                failed.add(key)
                continue
            # every job ranked before it is passed, visited in arrival order: of several passed too
            # often at once, the earliest arrival reserves (one reservation at a time)
            for other in self.waiting:
                if rank[other] < rank[name]:
                    self._passed(self.jobs[other])
            out.append(self._apply(job, option, job.demand))
            job.phase, job.admitted, job.alone_s = "profile", now, 0.0
            self.waiting.remove(name)
            self._unreserve(name)
        return out

    def step_done(self, job: str, profile: StepProfile, now: float) -> Progress:
        """``job`` finished a step that ran as ``profile``: its pace and urgency; after its profile
        steps its measured demand and micro-shift; later, while a job waits that fits nowhere, a
        move onto fuller WPGs that releases one of its own, and while none waits, a move onto
        fresh WPGs of its own if it shares one."""
        if not self.policy.adaptive:
            return Progress()
        j = self.jobs[job]
        j.alone_s += profile.alone_s
        urgent = self._urgency(j, now)
        if j.phase != "profile":
            if self._refused:
                return Progress(self._consolidate(j), urgent)
            return Progress(None if self.waiting else self._spread_out(j), urgent)
        j.steps.append(profile)
        if len(j.steps) < self.policy.profile_steps:
            return Progress(None, urgent)
        j.phase = "placed"
        measured = measure_demand(j.steps)
        move = self._shift(j, measured)
        return Progress(move, urgent)

    def finish(self, job: str) -> list[Slot]:
        """``job`` ended: it leaves its WPGs; returns those now empty (released, devices free)."""
        j = self.jobs.pop(job)
        if j.placed is None:
            self.waiting.remove(job)
            self._unreserve(job)
            return []
        return self._leave(j)

    def restore(self, name: str, domain: str, kind: str, affinity: str, node: int, size: int,
                capacity: int = 1) -> Slot:
        """Record a WPG that exists already (a live engine rebuilding its placer's view): ``size``
        devices on node ``node`` of ``domain`` (its first free ones). ValueError if they are not free."""
        if name in self.slots:
            raise ValueError(f"WPG {name!r} is recorded already")
        free = self.domains[domain].free[node]
        if len(free) < size:
            raise ValueError(f"WPG {name!r}: node {node} of {domain} has {len(free)} free devices, not {size}")
        return self._add_slot(Slot(name, domain, kind, affinity, tuple((node, d) for d in free[:size]), capacity))

    def seat(self, job: str, shape: JobShape, demand: Demand, rollout: Sequence[str], train: str,
             now: float) -> None:
        """Record a job that runs already on recorded WPGs (``restore``), past its profile."""
        if job in self.jobs:
            raise ValueError(f"job {job!r} is recorded already")
        j = _Job(job, shape, demand, now, self._order, phase="placed", admitted=now)
        self._order += 1
        for name in rollout:
            self.slots[name].put(job, demand.rollout)
        self.slots[train].put(job, demand.train)
        j.placed = Placement(job, self.slots[train].domain, tuple(rollout), train)
        self.jobs[job] = j

    # -- views --------------------------------------------------------------------------------
    def demand(self, job: str) -> Demand:
        return self.jobs[job].demand

    def placement(self, job: str) -> Placement | None:
        return self.jobs[job].placed

    def held_devices(self) -> int:
        return self._held

    def is_urgent(self, job: str) -> bool:
        return self.jobs[job].urgent

    # -- the policy ---------------------------------------------------------------------------
    def _unreserve(self, job: str) -> None:
        self.reserved = {d: j for d, j in self.reserved.items() if j != job}

    def _reservation_of(self, job: str) -> str | None:
        return next((d for d, j in self.reserved.items() if j == job), None)

    def _passed(self, job: _Job) -> None:
        """A later job started while ``job`` waited; passed too often, it reserves a domain."""
        job.passed += 1
        if job.passed <= self.policy.max_passed or self._reservation_of(job.name) is not None:
            return
        free = [d for d in self.domains.values() if d.name not in self.reserved]
        if not self.reserved and len(free) > 1:  # one reservation at a time; other domains stay open
            domain = max(free, key=lambda d: (d.free_devices(), [-ord(c) for c in d.name]))
            self.reserved[domain.name] = job.name

    def _closed(self, slot: Slot, job: str) -> bool:
        """A WPG takes no new job while one of its jobs is urgent."""
        return self.policy.close_urgent and any(self.jobs[other].urgent for other in slot.jobs if other != job)

    def _best(self, job: _Job, demand: Demand, *, pack: bool, fresh: bool = True) -> _Option | None:
        """The best option over the domains open to ``job``: with ``pack``, the fewest fresh
        devices, then the fullest WPGs (best fit); else the lowest peak load (spread), then the
        fewest fresh devices. Ties: the domain left with the fewest free devices, then its name.
        ``fresh=False``: only options that form no WPG."""
        best, best_key = None, None
        for domain in self.domains.values():
            holder = self.reserved.get(domain.name)
            if holder is not None and holder != job.name:
                continue
            option = self._option_in(domain, job, demand, pack=pack, fresh=fresh)
            if option is None:
                continue
            formed = sum(len(d) for d in option.devices)
            left = domain.free_devices() - formed  # best fit: the domain it leaves least free
            key = (formed, -option.fill, left, domain.name) if pack else (option.peak, formed, left, domain.name)
            if best_key is None or key < best_key:
                best, best_key = option, key
        return best

    def _room(self, domain: Domain, job: _Job, kind: str, demand: float, pack: bool) -> list[tuple[float, str]]:
        """(load without ``job``, name) of the domain's open WPGs of the job's affinity, ``kind``
        and size that take ``demand`` within the limit: fullest first with ``pack``, else emptiest."""
        out = []
        index = (domain.name, kind, job.shape.affinity_of(kind), job.shape.devices(kind))
        for s in self._index.get(index, {}).values():
            load = s.load - s.jobs.get(job.name, 0.0)
            if load + demand <= self.policy.limit + 1e-9 and not self._closed(s, job.name):
                out.append((load, s.name))
        own = {*job.placed.rollout, job.placed.train} if job.placed else set()
        # ties: the job's own WPGs first (staying costs no switch), then by name
        out.sort(key=(lambda x: (-x[0], x[1] not in own, x[1])) if pack else (lambda x: (x[0], x[1] not in own, x[1])))
        return out

    def _option_in(self, domain: Domain, job: _Job, demand: Demand, *, pack: bool,
                   fresh: bool = True) -> _Option | None:
        """Where ``job`` would go in ``domain``: with ``pack``, existing WPGs first and fresh
        ones for the rest; else as many fresh WPGs as the free devices hold, then the emptiest.
        ``fresh=False``: only an option that forms no WPG."""
        shape = job.shape
        trains = self._room(domain, job, "train", demand.train, pack)
        if not (trains or fresh):
            return None
        rollouts = self._room(domain, job, "rollout", demand.rollout, pack)
        choices = []  # (fresh rollout WPGs, fresh train WPG), most preferred first
        if pack:
            choices.append((max(0, shape.replicas - len(rollouts)), not trains))
        else:
            for fresh_train in (True, False) if trains else (True,):
                choices += [(k, fresh_train) for k in range(shape.replicas, -1, -1)
                            if shape.replicas - k <= len(rollouts)]
        if not fresh:
            choices = [(k, t) for k, t in choices if not (k or t)]
        for fresh_r, fresh_t in choices:
            sizes = [shape.rollout_devices] * fresh_r + [shape.train_devices] * fresh_t
            devices = domain.plan(sizes) if sizes else []
            if devices is None:
                continue
            reused = rollouts[:shape.replicas - fresh_r]
            train = None if fresh_t else trains[0]
            loads = ([load + demand.rollout for load, _ in reused] + [demand.rollout] * fresh_r
                     + [demand.train if train is None else train[0] + demand.train])
            return _Option(domain.name, tuple(n for _, n in reused) + (None,) * fresh_r,
                           None if train is None else train[1], tuple(devices), max(loads), sum(loads) / len(loads))
        return None

    def _form(self, domain: Domain, kind: str, shape: JobShape, devices: tuple[tuple[int, int], ...]) -> Slot:
        self._names += 1
        return self._add_slot(Slot(f"{domain.name}/{kind[0]}{self._names}", domain.name, kind,
                                   shape.affinity_of(kind), devices, shape.capacity(kind)))

    def _add_slot(self, slot: Slot) -> Slot:
        domain = self.domains[slot.domain]
        devices = slot.devices
        domain.take(devices)
        self._held += len(devices)
        self.slots[slot.name] = slot
        self._index.setdefault((domain.name, slot.kind, slot.affinity, len(devices)), {})[slot.name] = slot
        return slot

    def _apply(self, job: _Job, option: _Option, demand: Demand) -> Placement:
        """Put ``job`` where ``option`` says (forming its fresh WPGs), leaving where it was."""
        domain = self.domains[option.domain]
        before = job.placed
        if before is not None:
            self._detach(job)
        fresh = iter(option.devices)
        formed = []
        rollout = []
        for name in option.rollout:
            if name is None:
                formed.append(self._form(domain, "rollout", job.shape, next(fresh)))
                name = formed[-1].name
            rollout.append(name)
        train = option.train
        if train is None:
            formed.append(self._form(domain, "train", job.shape, next(fresh)))
            train = formed[-1].name
        for name in rollout:
            self.slots[name].put(job.name, demand.rollout)
        self.slots[train].put(job.name, demand.train)
        released = self._release(before) if before is not None else ()
        job.demand = demand
        job.placed = Placement(job.name, domain.name, tuple(rollout), train, tuple(formed), released,
                               moved=before is not None)
        return job.placed

    def _release(self, placement: Placement) -> tuple[Slot, ...]:
        """Release the WPGs of ``placement`` left empty."""
        out = []
        for name in dict.fromkeys((*placement.rollout, placement.train)):
            slot = self.slots[name]
            if not slot.jobs:
                self._released += 1
                self._held -= len(slot.devices)
                del self.slots[name]
                del self._index[(slot.domain, slot.kind, slot.affinity, len(slot.devices))][name]
                self.domains[slot.domain].give_back(slot.devices)
                out.append(slot)
        return tuple(out)

    def _detach(self, job: _Job) -> None:
        """``job`` no longer uses the WPGs it was placed on (they stay, maybe empty)."""
        for name in (*job.where.rollout, job.where.train):
            self.slots[name].drop(job.name)

    def _leave(self, job: _Job) -> list[Slot]:
        self._detach(job)
        return list(self._release(job.where))

    def _releases(self, job: _Job, option: _Option) -> bool:
        """Whether moving ``job`` as ``option`` says would leave one of its WPGs empty."""
        target = {*option.rollout, option.train}
        return any(len(self.slots[n].jobs) == 1 and n not in target for n in (*job.where.rollout, job.where.train))

    def _shift(self, job: _Job, measured: Demand) -> Placement | None:
        """Phase 2: the measured demand replaces the declared one where the job is; while jobs
        wait for room, it moves to the fullest WPGs that take it if that releases WPGs (or if
        where it is now breaks the limit)."""
        placed = job.where
        job.demand = measured
        for name in placed.rollout:
            self.slots[name].put(job.name, measured.rollout)
        self.slots[placed.train].put(job.name, measured.train)
        own = [self.slots[n] for n in (*placed.rollout, placed.train)]
        over = any(s.load > self.policy.limit + 1e-9 for s in own)
        alone = any(len(s.jobs) == 1 for s in own)
        if not self.waiting or not (over or alone):
            return None
        option = self._best(job, measured, pack=True)
        if option is None or (option.devices and not over):
            return None  # a move must release devices, not take more
        if {*option.rollout, option.train} == {*placed.rollout, placed.train}:
            return None
        if not over and not self._releases(job, option):
            return None  # it would release nothing
        return self._apply(job, option, measured)

    def _consolidate(self, job: _Job) -> Placement | None:
        """Move ``job`` onto the fullest WPGs that take it (no fresh ones), if it is alone on one
        of its WPGs and the move releases that one."""
        placed = job.where
        own = [self.slots[n] for n in (*placed.rollout, placed.train)]
        if not any(len(s.jobs) == 1 for s in own):
            return None
        option = self._best(job, job.demand, pack=True, fresh=False)
        if option is not None and self._releases(job, option):
            return self._apply(job, option, job.demand)
        return self._gather(job, own) if self.policy.gather else None

    def _gather(self, job: _Job, own: list[Slot]) -> Placement | None:
        """Move each side of ``job`` it is alone on (its train WPG, a rollout replica's WPG) onto
        the fullest other WPG of its domain that takes it (one the job does not use already),
        releasing its own; the other sides stay. None if no side can move."""
        placed = job.where
        domain = self.domains[placed.domain]
        before = [s.name for s in own]  # rollout replicas in order, then the train WPG
        names = list(before)
        for i, slot in enumerate(own):
            if len(slot.jobs) != 1:
                continue
            room = self._room(domain, job, slot.kind, job.demand.of(slot.kind), pack=True)
            target = next((name for load, name in room if name not in names and load > 0), None)
            if target is not None:
                names[i] = target
        if names == before:
            return None
        # peak and fill rank options; this one is not ranked, and _apply reads only where it goes
        option = _Option(domain.name, tuple(names[:-1]), names[-1], (), peak=0.0, fill=0.0)
        return self._apply(job, option, job.demand)

    def _spread_out(self, job: _Job) -> Placement | None:
        """With nobody waiting, a job that shares a WPG moves to fresh WPGs of its own (it then
        runs as alone); checked again only after WPGs were released somewhere."""
        if job.checked == self._released:
            return None
        job.checked = self._released
        placed = job.where
        if all(len(self.slots[n].jobs) == 1 for n in (*placed.rollout, placed.train)):
            return None
        option = self._best(job, job.demand, pack=False)
        if option is None or any(name is not None for name in option.rollout) or option.train is not None:
            return None  # only a wholly fresh set runs it as alone
        return self._apply(job, option, job.demand)

    def _urgency(self, job: _Job, now: float) -> bool | None:
        """The job's pace against the slowdown bound: whether its urgency changed, and to what."""
        if job.alone_s <= 0:
            return None
        pace = (now - job.admitted) / job.alone_s
        bound, margin = self.policy.slowdown_bound, self.policy.margin
        if not job.urgent and pace >= bound - margin:
            job.urgent = True
            return True
        if job.urgent and pace < bound - 2 * margin:
            job.urgent = False
            return False
        return None
