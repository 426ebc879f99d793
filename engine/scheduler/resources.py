"""The scheduler's resource model and placement: pure functions of explicit state (docs/architecture.md §4).

No Ray, no wall clock, no randomness: every time is an argument, so the live engine and the
simulator run the same code.

- Hierarchical views: a ``Cluster`` of ``NodeGroup``s of ``Node``s of devices, with lookups both
  ways (devices of a group, node and group of a device).
- ``WpgSpec``: what a worker process group can host (backend, layout, devices, memory,
  architectures, size); ``can_host`` is the affinity check.
- ``Horizon``: one node group's cyclic time horizon (one period, a device capacity) onto which jobs'
  periodic demand is laid. Overflow (device-seconds of demand above capacity in one period) and
  peak are exact: a sweep over the interval endpoints, no sampling grid.
- ``ReservationBook``: atomic device reservations over time windows (all devices or none).
- Placement phase 2, ``micro_shift``: a profiled job (``JobDemand``, derived from a profiled run by
  ``demand_from_profile``) goes to the node group and phase offset whose idle windows its demand
  fills best; ``start_delay`` then nudges its steps to keep that alignment.

Periods that differ. A horizon has exactly one period H. A job whose period p differs is laid on it
as the nearest pattern that repeats within H: n = max(1, round(H / p)) repetitions, each stretched
(or squeezed) by the factor H / (n * p), so offsets, durations and the duty cycle keep their
proportions. This is exact when p divides H (the common case is p == H); otherwise the alignment
between the job and the horizon would drift anyway, and this is the closest fixed pattern.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import median

BACKENDS = frozenset({"torch", "megatron", "vllm"})
PHASE_KINDS = frozenset({"rollout", "train"})
# Which phases each backend's WPGs run (the torch backend serves every function).
BACKEND_SERVES: Mapping[str, frozenset[str]] = {
    "torch": frozenset({"rollout", "train"}),
    "megatron": frozenset({"train"}),
    "vllm": frozenset({"rollout"}),
}
MAX_REPEATS = 1024  # a job repeated more often per horizon period is a mismatched horizon, not a pattern
MAX_OFFSETS = 100_000  # offsets micro_shift tries per group; more means the step is far too fine
OVERFLOW_DIGITS = 9  # overflows that agree to 1e-9 device-seconds tie (float noise must not pick the offset)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# --- hierarchical views ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    id: str
    node: str


@dataclass(frozen=True)
class Node:
    """A machine in a node group. ``memory_bytes``: memory of each of its devices (alike on a node)."""

    name: str
    group: str
    devices: tuple[str, ...]
    memory_bytes: int = 0

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        _require(len(set(self.devices)) == len(self.devices), f"node {self.name!r} lists a device twice")


@dataclass(frozen=True)
class NodeGroup:
    """Nodes that share a cyclic horizon (typically one fast interconnect domain)."""

    name: str
    nodes: tuple[Node, ...]

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        strays = [n.name for n in self.nodes if n.group != self.name]
        _require(not strays, f"nodes {strays} do not say they belong to group {self.name!r}")

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for n in self.nodes for d in n.devices)


@dataclass(frozen=True)
class Cluster:
    """Cluster → node group → node → device. Order is declaration order everywhere (it decides ties)."""

    groups: tuple[NodeGroup, ...]
    _groups: dict[str, NodeGroup] = field(init=False, repr=False, compare=False)
    _nodes: dict[str, Node] = field(init=False, repr=False, compare=False)
    _devices: dict[str, Device] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(self.groups))
        groups, nodes, devices = {}, {}, {}
        for g in self.groups:
            _require(g.name not in groups, f"node group {g.name!r} appears twice")
            groups[g.name] = g
            for n in g.nodes:
                _require(n.name not in nodes, f"node {n.name!r} appears twice")
                nodes[n.name] = n
                for d in n.devices:
                    _require(d not in devices, f"device {d!r} appears twice")
                    devices[d] = Device(d, n.name)
        object.__setattr__(self, "_groups", groups)
        object.__setattr__(self, "_nodes", nodes)
        object.__setattr__(self, "_devices", devices)

    @classmethod
    def uniform(cls, groups: int = 1, nodes_per_group: int = 1, devices_per_node: int = 8,
                memory_bytes: int = 80 * 2**30) -> Cluster:
        """Identical nodes named ``g0``, ``g0n1``, ``g0n1d3`` (group, node, device by index)."""
        _require(min(groups, nodes_per_group, devices_per_node) >= 1, "a uniform cluster needs at least one of each")
        return cls(tuple(
            NodeGroup(f"g{g}", tuple(
                Node(f"g{g}n{n}", f"g{g}", tuple(f"g{g}n{n}d{d}" for d in range(devices_per_node)), memory_bytes)
                for n in range(nodes_per_group)))
            for g in range(groups)))

    def group(self, name: str) -> NodeGroup:
        return self._groups[name]

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def device(self, id: str) -> Device:  # noqa: A002 - the device's field is called id
        return self._devices[id]

    def nodes(self, group: str | None = None) -> tuple[Node, ...]:
        if group is None:
            return tuple(self._nodes.values())
        return self._groups[group].nodes

    def devices(self, group: str | None = None, node: str | None = None) -> tuple[str, ...]:
        """Devices of the node, else of the group, else of the cluster (a node outside the group: error)."""
        if node is not None:
            found = self._nodes[node]
            _require(group is None or found.group == group, f"node {node!r} is not in group {group!r}")
            return found.devices
        if group is not None:
            return self._groups[group].devices
        return tuple(self._devices)

    def node_of(self, device: str) -> Node:
        return self._nodes[self._devices[device].node]

    def group_of(self, device: str) -> NodeGroup:
        return self._groups[self.node_of(device).group]


# --- worker process groups and affinity -----------------------------------------------------------


@dataclass(frozen=True)
class WpgSpec:
    """What a WPG can host. ``devices`` hold ``len(devices) // tp`` model replicas of ``tp`` ranks each;
    ``memory_bytes`` is per device."""

    name: str
    backend: str
    tp: int
    devices: tuple[str, ...]
    memory_bytes: int
    architectures: frozenset[str]
    max_params: int

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "architectures", frozenset(self.architectures))
        _require(self.backend in BACKENDS, f"unknown backend {self.backend!r}; one of {sorted(BACKENDS)}")
        _require(self.tp >= 1, f"WPG {self.name!r}: tp must be >= 1")
        _require(len(self.devices) >= 1 and len(self.devices) % self.tp == 0,
                 f"WPG {self.name!r}: {len(self.devices)} devices are not whole replicas of tp={self.tp}")
        _require(len(set(self.devices)) == len(self.devices), f"WPG {self.name!r} lists a device twice")
        _require(self.memory_bytes >= 0 and self.max_params >= 0, f"WPG {self.name!r}: negative size")

    @property
    def serves(self) -> frozenset[str]:
        return BACKEND_SERVES[self.backend]


def can_host(wpg: WpgSpec, arch: str, params: int, state_bytes: int) -> bool:
    """Affinity: the WPG runs this architecture, the model is within its size, and the state fits.

    A job's state is split over the ``tp`` ranks of one replica and every replica holds a whole copy
    (data parallel), so it fits when ``state_bytes <= tp * memory_bytes``: adding replicas adds
    throughput, not room.
    """
    return arch in wpg.architectures and params <= wpg.max_params and state_bytes <= wpg.tp * wpg.memory_bytes


# --- the cyclic horizon ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """``devices`` busy from ``offset_s`` for ``duration_s`` in every period (wrapping at its end;
    a duration longer than the period overlaps its own next occurrence)."""

    offset_s: float
    duration_s: float
    devices: int

    def __post_init__(self):
        _require(math.isfinite(self.offset_s), f"offset must be finite, got {self.offset_s}")
        _require(math.isfinite(self.duration_s) and self.duration_s >= 0,
                 f"duration must be finite and >= 0, got {self.duration_s}")
        _require(self.devices >= 1, f"an interval needs >= 1 device, got {self.devices}")


@dataclass(frozen=True, order=True)
class Load:
    """How a horizon copes: device-seconds above capacity per period, then most devices busy at once."""

    overflow: float
    peak: int


Segment = tuple[float, float, int]  # [start, end) within [0, period), devices
Piece = tuple[float, float, int]  # an interval as (offset, duration, devices), already checked


def _wrap(t: float, period: float) -> float:
    t = t % period
    return 0.0 if t >= period else t  # a tiny negative t rounds up to the period itself


def _segments(intervals: Iterable[Interval], period: float) -> Iterator[Segment]:
    """Cut intervals at the period's end: whole periods, then the rest wrapped to the start."""
    return _piece_segments(((iv.offset_s, iv.duration_s, iv.devices) for iv in intervals), period)


def _piece_segments(pieces: Iterable[Piece], period: float) -> Iterator[Segment]:
    for offset, duration, devices in pieces:
        whole, rest = divmod(duration, period)
        if whole:
            yield (0.0, period, devices * int(whole))
        if rest > 0:
            start = _wrap(offset, period)
            end = start + rest
            if end <= period:
                yield (start, end, devices)
            else:
                yield (start, period, devices)
                yield (0.0, end - period, devices)


def _deltas(segments: Iterable[Segment], into: dict[float, int] | None = None) -> defaultdict[float, int]:
    """The demand's changes: devices added at each segment's start, taken off at its end (added
    to ``into``, a copy of another demand's changes, when given)."""
    deltas: defaultdict[float, int] = defaultdict(int, into or {})
    _add_deltas(segments, deltas)
    return deltas


def _levels(segments: Iterable[Segment], period: float) -> list[Segment]:
    """The demand as a step function: (start, end, devices) pieces covering [0, period) exactly."""
    return _steps(_deltas(segments), period)


def _steps(deltas: dict[float, int], period: float) -> list[Segment]:
    level, steps = 0, []
    for t0, t1 in pairwise(sorted({0.0, period, *deltas})):
        level += deltas.get(t0, 0)
        if t0 < t1 <= period:
            steps.append((t0, t1, level))
    return steps


def _breakpoints(deltas: dict[float, int], period: float) -> tuple[list[float], set[float]]:
    """Where a step function of these changes may change level (``_steps``'s), sorted, and as a set."""
    points = {0.0, period, *deltas}
    return sorted(points), points


def _merged_load(points: tuple[list[float], set[float]], base: dict[float, int], extra: dict[float, int],
                 period: float, capacity: int) -> Load:
    """``_load(_steps(base + extra, period), capacity)``, ``base``'s breakpoints given
    (``_breakpoints``) and ``extra``'s (a few) merged in. The walk is ``_steps``'s and ``_load``'s
    in one loop, not a generator fed to ``_load``: micro-shift runs it 20 times a placement, and
    through a generator a compiled paper-math mode took 28.6-30.1 s against 27.2-28.2 s."""
    order, known = points
    new = [t for t in extra if t not in known]
    if new:
        order = sorted(order + new)  # a sorted run and a short tail: a linear merge
    overflow, peak, level = 0.0, 0, 0
    for t0, t1 in pairwise(order):
        level += base.get(t0, 0) + extra.get(t0, 0)
        if t0 < t1 <= period:
            overflow += (t1 - t0) * max(0, level - capacity)
            peak = max(peak, level)
    return Load(overflow, peak)


def _add_deltas(segments: Iterable[Segment], deltas: defaultdict[float, int]) -> None:
    for start, end, devices in segments:
        if end > start:
            deltas[start] += devices
            deltas[end] -= devices


def _load(levels: Iterable[Segment], capacity: int) -> Load:
    overflow, peak = 0.0, 0
    for t0, t1, level in levels:
        overflow += (t1 - t0) * max(0, level - capacity)
        peak = max(peak, level)
    return Load(overflow, peak)


def _fit_period(intervals: Iterable[Interval], period_s: float | None, horizon_s: float) -> tuple[Interval, ...]:
    """Lay a job's intervals (in its own period) onto a horizon period (module docstring: periods
    that differ). Offsets come back in [0, horizon_s)."""
    raw = [(iv.offset_s, iv.duration_s, iv.devices) for iv in intervals]
    return tuple(Interval(*piece) for piece in _fit_pieces(raw, period_s, horizon_s))


def _fit_pieces(pieces: list[Piece], period_s: float | None, horizon_s: float) -> list[Piece]:
    """``_fit_period`` on pieces (no Interval made: ``Candidate.loads`` lays a job many times)."""
    if period_s is None or math.isclose(period_s, horizon_s, rel_tol=1e-9):
        return [(_wrap(offset, horizon_s), duration, devices) for offset, duration, devices in pieces]
    _require(math.isfinite(period_s) and period_s > 0, f"a job's period must be > 0, got {period_s}")
    repeats = max(1, round(horizon_s / period_s))
    _require(repeats <= MAX_REPEATS, f"period {period_s} s repeats {repeats} times in a {horizon_s} s horizon")
    every = horizon_s / repeats
    scale = every / period_s
    return [(_wrap(offset * scale + k * every, horizon_s), duration * scale, devices)
            for k in range(repeats) for offset, duration, devices in pieces]


@dataclass(frozen=True)
class Horizon:
    """One node group's cyclic horizon: a period, a capacity in devices, and the jobs laid on it.

    Immutable: ``place`` and ``remove`` return new horizons, so trying an offset costs nothing and
    removing a job restores exactly the horizon it was placed on. ``placed`` is kept sorted by job.
    """

    period_s: float
    capacity: int
    placed: tuple[tuple[str, tuple[Interval, ...]], ...] = ()

    def __post_init__(self):
        _require(math.isfinite(self.period_s) and self.period_s > 0,
                 f"a horizon's period must be finite and > 0, got {self.period_s}")
        _require(self.capacity >= 0, f"capacity must be >= 0, got {self.capacity}")
        jobs = [job for job, _ in self.placed]
        _require(jobs == sorted(set(jobs)), "placed must be sorted by job, one entry per job")

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(job for job, _ in self.placed)

    def intervals(self, job: str) -> tuple[Interval, ...]:
        for name, intervals in self.placed:
            if name == job:
                return intervals
        raise KeyError(job)

    def place(self, job: str, intervals: Iterable[Interval], *, period_s: float | None = None) -> Horizon:
        """This horizon plus ``job``'s intervals; ``period_s``: the job's period when not the horizon's."""
        _require(job not in self.jobs, f"job {job!r} is already on this horizon")
        entry = (job, _fit_period(intervals, period_s, self.period_s))
        return Horizon(self.period_s, self.capacity, tuple(sorted((*self.placed, entry), key=lambda e: e[0])))

    def remove(self, job: str) -> Horizon:
        if job not in self.jobs:
            raise KeyError(job)
        return Horizon(self.period_s, self.capacity, tuple(e for e in self.placed if e[0] != job))

    def segments(self) -> list[Segment]:
        """Every job's busy pieces within [0, period): (start, end, devices)."""
        return [s for _, intervals in self.placed for s in _segments(intervals, self.period_s)]

    def demand(self, t: float) -> int:
        """Devices demanded at time ``t`` (any real; taken modulo the period; intervals are [start, end))."""
        t = _wrap(t, self.period_s)
        return sum(devices for start, end, devices in self.segments() if start <= t < end)

    def load(self) -> Load:
        return _load(_levels(self.segments(), self.period_s), self.capacity)

    def overflow(self) -> float:
        """∫ over one period of max(0, demand - capacity), in device-seconds."""
        return self.load().overflow

    def peak(self) -> int:
        return self.load().peak


# --- atomic reservations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    key: str
    devices: tuple[str, ...]
    start: float
    end: float  # exclusive; may be inf (held until released)


class ReservationBook:
    """Device reservations over time windows [start, end). A request gets all its devices or none,
    and no device is ever booked for two overlapping windows.

    Which devices (deterministic, declaration order breaks ties): the fullest single node that still
    fits (best fit, so emptier nodes stay whole for larger requests); else, when no scope was given,
    the fullest single group that fits; else the nodes with the most free devices first, so a request
    spans as few nodes as it can. Within a node, devices in declaration order.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._reservations: dict[str, Reservation] = {}
        self._booked: dict[str, list[tuple[float, float, str]]] = {d: [] for d in cluster.devices()}

    @property
    def reservations(self) -> dict[str, Reservation]:
        return dict(self._reservations)

    def booked(self, device: str) -> list[tuple[float, float, str]]:
        """The device's reservations as (start, end, key), by start."""
        return sorted(self._booked[device])

    def is_free(self, device: str, start: float, end: float) -> bool:
        return all(e <= start or end <= s for s, e, _ in self._booked[device])

    def free(self, start: float, end: float, *, group: str | None = None, node: str | None = None) -> tuple[str, ...]:
        """Devices in scope with no reservation overlapping [start, end)."""
        return tuple(d for d in self.cluster.devices(group, node) if self.is_free(d, start, end))

    def reserve(self, key: str, devices_needed: int, start: float, end: float, *, group: str | None = None,
                node: str | None = None) -> tuple[str, ...] | None:
        """Book ``devices_needed`` devices of the scope (a node, a group, else the cluster) for
        [start, end). Returns the devices, or None (and changes nothing) when too few are free."""
        _require(devices_needed >= 1, f"a reservation needs >= 1 device, got {devices_needed}")
        _require(end > start, f"a reservation needs end > start, got [{start}, {end})")  # also rejects nan
        _require(key not in self._reservations, f"reservation {key!r} already exists")
        chosen = self._choose(devices_needed, start, end, group, node)
        if chosen is None:
            return None
        self._reservations[key] = Reservation(key, chosen, start, end)
        for d in chosen:
            self._booked[d].append((start, end, key))
        return chosen

    def release(self, key: str) -> Reservation:
        reservation = self._reservations.pop(key)
        for d in reservation.devices:
            self._booked[d] = [b for b in self._booked[d] if b[2] != key]
        return reservation

    def _choose(self, needed: int, start: float, end: float, group: str | None,
                node: str | None) -> tuple[str, ...] | None:
        scope = self.cluster.devices(group, node)  # validates the names and that the node is in the group
        nodes = [self.cluster.node(node)] if node is not None else list(self.cluster.nodes(group))
        free = {n.name: [d for d in n.devices if self.is_free(d, start, end)] for n in nodes}
        if sum(map(len, free.values())) < needed:
            return None
        fitting = [n for n in nodes if len(free[n.name]) >= needed]
        if fitting:
            best = min(fitting, key=lambda n: len(free[n.name]))  # min keeps the first of equals
            return tuple(free[best.name][:needed])
        if group is None and node is None:
            groups = [g for g in self.cluster.groups if sum(len(free[n.name]) for n in g.nodes) >= needed]
            if groups:
                best_group = min(groups, key=lambda g: sum(len(free[n.name]) for n in g.nodes))
                nodes = list(best_group.nodes)
        chosen: list[str] = []
        for n in sorted(nodes, key=lambda n: -len(free[n.name])):  # sorted is stable: declaration order on ties
            chosen.extend(free[n.name][: needed - len(chosen)])
            if len(chosen) == needed:
                break
        assert set(chosen) <= set(scope)
        return tuple(chosen)


# --- jobs' demand and the profile it comes from ---------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """A part of a job's step: ``devices`` busy from ``offset_s`` after the step starts, for ``duration_s``."""

    kind: str  # rollout | train
    offset_s: float
    duration_s: float
    devices: int

    def __post_init__(self):
        _require(self.kind in PHASE_KINDS, f"unknown phase kind {self.kind!r}; one of {sorted(PHASE_KINDS)}")
        Interval(self.offset_s, self.duration_s, self.devices)  # same checks


@dataclass(frozen=True)
class JobDemand:
    """A profiled job: its step period, its phases within a step, and what its WPGs must host.
    ``state_bytes`` is checked against every WPG a phase needs (conservative for rollout WPGs)."""

    job: str
    period_s: float
    phases: tuple[Phase, ...]
    arch: str
    params: int
    state_bytes: int
    base_model: str = ""

    def __post_init__(self):
        object.__setattr__(self, "phases", tuple(self.phases))
        _require(math.isfinite(self.period_s) and self.period_s > 0, f"a job's period must be > 0, got {self.period_s}")
        _require(len(self.phases) >= 1, f"job {self.job!r} has no phases")

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(p.kind for p in self.phases)

    def intervals(self, offset_s: float = 0.0, kinds: Iterable[str] = PHASE_KINDS) -> tuple[Interval, ...]:
        """The phases of ``kinds`` as intervals of a step that starts ``offset_s`` into the period."""
        kinds = frozenset(kinds)
        return tuple(Interval(offset_s + p.offset_s, p.duration_s, p.devices) for p in self.phases if p.kind in kinds)


def demand_from_profile(step_starts: Sequence[float],
                        calls: Iterable[tuple[str, float, float, int]]) -> tuple[float, tuple[Phase, ...]]:
    """A profiled run's period and phases, from its step boundaries and its calls (kind, start, end, devices).

    ``step_starts`` are the instants steps began, strictly increasing; the last one ends the last
    profiled step (pass the end of the run), so n boundaries make n - 1 steps. The period is the
    median step length. A call belongs to the step in which it starts; calls outside the profiled
    steps (warm-up, an unfinished last step) are ignored. Calls' start/end are execution times (the
    caller excludes queue wait).

    Steps are not always alike (a checkpoint now and then), so the phases are those of the most
    common step shape (the sequence of (kind, devices) of its calls by start; ties: the earliest
    shape), each call's offset and duration the median over the steps of that shape.
    """
    bounds = [float(t) for t in step_starts]
    _require(len(bounds) >= 2, "a profile needs at least two step boundaries (one whole step)")
    _require(all(a < b for a, b in pairwise(bounds)), "step starts must be strictly increasing")
    steps: list[list[tuple[float, str, int, float]]] = [[] for _ in range(len(bounds) - 1)]
    for kind, start, end, devices in calls:
        _require(end >= start, f"a call ends before it starts: [{start}, {end})")
        if not bounds[0] <= start < bounds[-1]:
            continue
        i = bisect_right(bounds, start) - 1
        steps[i].append((start - bounds[i], kind, devices, end - start))
    for step in steps:
        step.sort()
    shapes = [tuple((kind, devices) for _, kind, devices, _ in step) for step in steps]
    shape = Counter(shapes).most_common(1)[0][0]  # most_common keeps first-seen order among equals
    _require(len(shape) >= 1, "no calls within the profiled steps")
    alike = [step for step, s in zip(steps, shapes, strict=True) if s == shape]
    phases = tuple(
        Phase(kind, median(step[i][0] for step in alike), median(step[i][3] for step in alike), devices)
        for i, (kind, devices) in enumerate(shape))
    return median(b - a for a, b in pairwise(bounds)), phases


# --- placement phase 2: micro-shift ---------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A node group as micro-shift sees it.

    ``horizons``: one Horizon when the group's devices form one pool that every phase draws on
    (colocated WPGs), or one per phase kind (``{"rollout": ..., "train": ...}``) when the kinds run
    on separate WPGs with separate capacities; all of a group's horizons share one period.
    ``base_models``: base models whose weights the group already holds.
    """

    group: str
    horizons: Horizon | Mapping[str, Horizon]
    wpgs: tuple[WpgSpec, ...]
    base_models: frozenset[str] = frozenset()

    def __post_init__(self):
        object.__setattr__(self, "wpgs", tuple(self.wpgs))
        object.__setattr__(self, "base_models", frozenset(self.base_models))
        if not isinstance(self.horizons, Horizon):
            object.__setattr__(self, "horizons", dict(self.horizons))
            unknown = set(self.horizons) - PHASE_KINDS
            _require(not unknown, f"group {self.group!r}: horizons for unknown phase kinds {sorted(unknown)}")
            _require(len(self.horizons) >= 1, f"group {self.group!r} has no horizon")
            periods = {h.period_s for h in self.horizons.values()}
            _require(len(periods) == 1, f"group {self.group!r}: its horizons' periods differ ({sorted(periods)})")

    def _pools(self) -> list[tuple[frozenset[str], Horizon]]:
        """(phase kinds it takes, horizon) for every horizon of the group."""
        if isinstance(self.horizons, Horizon):
            return [(PHASE_KINDS, self.horizons)]
        return [(frozenset({kind}), h) for kind, h in sorted(self.horizons.items())]

    def hosts(self, demand: JobDemand) -> bool:
        """Every phase kind of the job has a horizon here and a WPG that serves it and can host the job."""
        pools = frozenset().union(*(kinds for kinds, _ in self._pools()))
        return all(
            kind in pools and any(kind in w.serves and can_host(w, demand.arch, demand.params, demand.state_bytes)
                                  for w in self.wpgs)
            for kind in demand.kinds)

    def place(self, demand: JobDemand, offset_s: float) -> Candidate:
        """This group with the job's steps starting ``offset_s`` into its period (in the job's time).
        A job already laid here is taken off first, so re-shifting a placed job does not count its
        old demand against it."""
        def lay(h: Horizon, kinds: Iterable[str]) -> Horizon:
            if demand.job in h.jobs:
                h = h.remove(demand.job)
            intervals = demand.intervals(offset_s, kinds)
            return h.place(demand.job, intervals, period_s=demand.period_s) if intervals else h

        if isinstance(self.horizons, Horizon):
            horizons: Horizon | dict[str, Horizon] = lay(self.horizons, PHASE_KINDS)
        else:
            horizons = {kind: lay(h, {kind}) for kind, h in self.horizons.items()}
        return Candidate(self.group, horizons, self.wpgs, self.base_models)

    def loads(self, demand: JobDemand, offsets: Sequence[float]) -> list[Load]:
        """``[self.place(demand, offset).load() for offset in offsets]``, the same numbers, faster:
        the other jobs' demand is summed and its breakpoints sorted once, and at each offset only
        the job's own few breakpoints are merged in (demands are whole devices, so the sums do not
        depend on their order, and the steps are summed in the same order)."""
        pools = []  # (the job's pieces at offset 0, horizon, the others' deltas, their breakpoints)
        everything: defaultdict[float, int] = defaultdict(int)
        for kinds, h in self._pools():
            if demand.job in h.jobs:
                h = h.remove(demand.job)
            deltas = _deltas(h.segments())
            for t, devices in deltas.items():
                everything[t] += devices
            pieces = [(p.offset_s, p.duration_s, p.devices) for p in demand.phases if p.kind in kinds]
            pools.append((pieces, h, deltas, _breakpoints(deltas, h.period_s)))
        period = pools[0][1].period_s
        all_points = _breakpoints(everything, period)
        none: dict[float, int] = {}
        alone = [_merged_load(points, deltas, none, h.period_s, h.capacity).overflow
                 for _, h, deltas, points in pools]  # a pool's overflow without the job
        out = []
        for offset in offsets:
            overflow = 0.0
            total: defaultdict[float, int] = defaultdict(int)
            for i, (pieces, h, deltas, points) in enumerate(pools):
                if not pieces:
                    overflow += alone[i]
                    continue
                laid = _fit_pieces([(offset + o, d, n) for o, d, n in pieces], demand.period_s, h.period_s)
                mine = _deltas(_piece_segments(laid, h.period_s))
                for t, devices in mine.items():
                    total[t] += devices
                overflow += _merged_load(points, deltas, mine, h.period_s, h.capacity).overflow
            out.append(Load(overflow, _merged_load(all_points, everything, total, period, 0).peak))
        return out

    def load(self) -> Load:
        """Overflow summed over the group's horizons; peak of the group's whole demand (all kinds)."""
        pools = [h for _, h in self._pools()]
        overflow = sum(h.overflow() for h in pools)
        everything = [s for h in pools for s in h.segments()]
        return Load(overflow, _load(_levels(everything, pools[0].period_s), 0).peak)


@dataclass(frozen=True)
class Shift:
    """Where micro-shift lays a job, and how that group's horizon then looks."""

    group: str
    offset_s: float  # where the job's steps start within its period
    overflow: float  # the group's overflow with the job laid on it (device-seconds per period)
    peak: int  # the group's peak demand with the job laid on it (devices)


def _offsets(period_s: float, step_s: float) -> list[float]:
    _require(math.isfinite(step_s) and step_s > 0, f"offset_step_s must be > 0, got {step_s}")
    count = max(1, math.ceil(period_s / step_s - 1e-9))
    _require(count <= MAX_OFFSETS, f"{count} offsets of {step_s} s in a {period_s} s period is too many")
    return [i * step_s for i in range(count)]


def micro_shift(demand: JobDemand, candidates: Iterable[Candidate], *, offset_step_s: float) -> Shift:
    """The node group and phase offset whose idle windows the job's demand fills best.

    Objective (docs/architecture.md §4), lexicographic over every candidate group that can host the job
    and every offset 0, step, 2·step, ... < the job's period: least overflow with the job added,
    then the least peak, then a group that already holds the job's base model, then group name,
    then the smaller offset. Raises LookupError when no group can host the job.
    """
    candidates = list(candidates)
    names = [c.group for c in candidates]
    _require(len(set(names)) == len(names), f"candidate groups appear twice: {names}")
    offsets = _offsets(demand.period_s, offset_step_s)
    hosting = [c for c in candidates if c.hosts(demand)]
    if not hosting:
        raise LookupError(
            f"no node group can host job {demand.job!r} (architecture {demand.arch!r}, {demand.params} parameters, "
            f"{demand.state_bytes} state bytes, phases {sorted(demand.kinds)}) among {sorted(names)}: each lacks a "
            f"WPG or horizon for some phase, or its WPGs' architectures, size or memory do not fit")
    best: tuple | None = None
    for c in hosting:
        has_base = bool(demand.base_model) and demand.base_model in c.base_models
        for offset, load in zip(offsets, c.loads(demand, offsets), strict=True):
            key = (round(load.overflow, OVERFLOW_DIGITS), load.peak, not has_base, c.group, offset)
            if best is None or key < best[0]:
                best = (key, Shift(c.group, offset, load.overflow, load.peak))
    assert best is not None
    return best[1]


def start_delay(now: float, anchor: float, period_s: float, offset_s: float, max_delay_s: float) -> float:
    """Seconds to hold the job's next step so it starts on its alignment grid anchor + offset + k·period
    (any integer k: the grid extends both ways from the anchor).

    The delay until the next grid instant at or after ``now`` is returned when it is at most
    ``max_delay_s``; otherwise 0: the step runs now. A step that is more than a small delay late is
    off its slot this once; holding it for most of a period would cost more than the overlap it
    avoids, and the next step gets another chance to realign. Never more than ``max_delay_s``.
    """
    _require(math.isfinite(period_s) and period_s > 0, f"period must be > 0, got {period_s}")
    _require(max_delay_s >= 0, f"max_delay_s must be >= 0, got {max_delay_s}")
    late = (now - anchor - offset_s) % period_s  # time since the last grid instant, in [0, period]
    delay = period_s - late
    if not 0 < delay < period_s:  # on the grid (a late of ~0 or ~period after rounding)
        delay = 0.0
    return delay if delay <= max_delay_s else 0.0
