"""Two-phase placement of live jobs on one node group's WPGs: profile, then micro-shift and align.

Phase 1: a new job runs ``profile_steps`` whole steps as it comes; each completed call's execution
interval is recorded (queue wait excluded: a call's interval starts when its WPG takes it).
Phase 2: its demand (``demand_from_profile``: period and phases) is laid by ``micro_shift`` onto
the node group's cyclic horizon at the phase offset whose idle windows it fills best, and each later
step is held back by a small start delay (``start_delay``) so the job stays on that phase.

The horizon counts WPGs, not devices: a rollout phase occupies one rollout WPG, a train phase one
train WPG, and a pool's capacity is how many WPGs of that kind there are (a WPG runs one call at a
time). WPGs that serve both kinds form one pool. The horizon's period is that of the first job
placed; later jobs with other periods are fitted onto it (``Horizon.place``).

Pure: times come in as arguments; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.api import ROLLOUT_FUNCTIONS
from engine.scheduler.resources import (
    Candidate,
    Horizon,
    JobDemand,
    WpgSpec,
    demand_from_profile,
    micro_shift,
    start_delay,
)

GROUP = "local"  # the engine's one node group
ARCH = "any"  # live WPGs were chosen by placement already; the horizon only needs their time


def phase_kind(fn: str) -> str:
    return "rollout" if fn in ROLLOUT_FUNCTIONS else "train"


@dataclass(frozen=True)
class Slot:
    """Where a placed job's steps start: origin + offset + k * period."""

    period_s: float
    offset_s: float


class Aligner:
    def __init__(self, *, profile_steps: int, max_delay_s: float, offset_steps: int):
        self.profile_steps = profile_steps
        self.max_delay_s = max_delay_s
        self.offset_steps = offset_steps
        self.pools: dict[str, int] = {}  # kind ("rollout", "train" or "both") -> WPGs
        self.origin: float | None = None  # time origin of the horizon (the first placement)
        self.period_s: float | None = None
        self.boundaries: dict[str, list[float]] = {}
        self.calls: dict[str, list[tuple[str, float, float, int]]] = {}
        self.demands: dict[str, JobDemand] = {}
        self.slots: dict[str, Slot] = {}

    def add_wpg(self, kind: str) -> None:
        """``kind``: "rollout", "train" or "both" (a WPG that serves every function)."""
        self.pools[kind] = self.pools.get(kind, 0) + 1

    def remove_wpg(self, kind: str) -> None:
        self.pools[kind] -= 1
        if not self.pools[kind]:
            del self.pools[kind]

    def profiling(self, job: str) -> bool:
        """Whether ``job``'s calls are still recorded (it is not placed on the horizon yet)."""
        return job not in self.slots

    def record(self, job: str, fn: str, start: float, end: float, phase: str | None = None) -> None:
        """A call of a job still being profiled ran on a WPG from ``start`` to ``end``; ``phase``:
        the side it ran on when its WPGs say so (a host-tier ``sync_weights`` runs on the trainer's),
        else the side ``fn`` belongs to."""
        if job not in self.slots:
            self.calls.setdefault(job, []).append((phase or phase_kind(fn), start, end, 1))

    def boundary(self, job: str, now: float) -> float:
        """A step of ``job`` starts now; returns how long to hold it (0 while profiling)."""
        if job not in self.slots:
            starts = self.boundaries.setdefault(job, [])
            starts.append(now)
            if len(starts) <= self.profile_steps or not self.pools or not self._place(job, starts):
                return 0.0
        slot = self.slots[job]
        assert self.origin is not None
        return start_delay(now, self.origin, slot.period_s, slot.offset_s, self.max_delay_s)

    def forget(self, job: str) -> None:
        for table in (self.boundaries, self.calls, self.demands, self.slots):
            table.pop(job, None)

    # -- phase 2 ----------------------------------------------------------------------------------
    def _horizons(self) -> Horizon | dict[str, Horizon]:
        assert self.period_s is not None
        assert self.origin is not None

        def laid(h: Horizon, kinds: set[str]) -> Horizon:
            for other, demand in self.demands.items():
                intervals = demand.intervals(self.slots[other].offset_s, kinds)
                if intervals:
                    h = h.place(other, intervals, period_s=demand.period_s)
            return h

        if "both" in self.pools or len(self.pools) == 1:
            return laid(Horizon(self.period_s, sum(self.pools.values())), {"rollout", "train"})
        return {kind: laid(Horizon(self.period_s, n), {kind}) for kind, n in self.pools.items()}

    def _place(self, job: str, starts: list[float]) -> bool:
        """Place ``job`` by its profile; False where the profile has no step shape to lay (steps
        without calls: a session whose loop logs its metrics with no call between), and the job
        is profiled again from its last boundary on, unheld meanwhile."""
        calls = self.calls.pop(job, [])
        try:
            period, phases = demand_from_profile(starts, calls)
        except ValueError:  # the profile's own shape (demand_from_profile's checks); nothing placed
            self.boundaries[job] = [starts[-1]]
            self.calls[job] = [c for c in calls if c[1] >= starts[-1]]
            return False
        self.boundaries.pop(job, None)
        demand = JobDemand(job, period, phases, ARCH, 0, 0)
        if self.origin is None:
            self.origin, self.period_s = starts[-1], period
        kinds = ("rollout", "train") if "both" in self.pools or len(self.pools) == 1 else tuple(self.pools)
        wpgs = tuple(WpgSpec(f"{GROUP}-{kind}", "torch", 1, (f"{GROUP}-{kind}-d",), 0, frozenset({ARCH}), 0)
                     for kind in kinds)
        shift = micro_shift(demand, [Candidate(GROUP, self._horizons(), wpgs)],
                            offset_step_s=max(period / self.offset_steps, 1e-3))
        self.demands[job] = demand
        self.slots[job] = Slot(period, shift.offset_s % period if math.isfinite(shift.offset_s) else 0.0)
        return True
