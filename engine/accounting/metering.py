"""Metering: the usage record every executed call yields, shared by live billing and the simulator.

A record says which job used which WPG's devices, for which function, from when to when, and how
much of that was switching the job's state in (setup). Billing is device-seconds of these records;
the same code runs on the live engine's wall clock and on the simulator's virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS


class UsageRecord(NamedTuple):
    """Immutable; a named tuple rather than a frozen dataclass because the simulator makes millions
    of them (one per WPG of every call), and a named tuple is made several times faster."""

    job: str
    role: str
    fn: str
    wpg: str
    devices: float
    start: float  # when the call got the WPG (clock seconds)
    end: float
    setup_s: float = 0.0  # of [start, end], seconds spent switching the job's state in
    exec_s: float | None = None  # of [start, end], seconds the WPG computed (measured by its ranks)
    call: int = 0  # the scheduler's call id
    tenant: str = ""
    queued_s: float = 0.0  # before start: seconds it waited, ready to run, for its WPGs (sharing's cost)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def device_seconds(self) -> float:
        return self.devices * self.seconds

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageRecord:
        return cls(**data)


def device_seconds(records: Iterable[UsageRecord], *, job: str | None = None) -> float:
    """Device-seconds billed for ``records`` (those of ``job`` when given), setup included."""
    return sum(r.device_seconds for r in records if job is None or r.job == job)


# The calls an async split deployment overlaps: the rollout side's generation against the train
# side's passes (the engine's function sets, less the weight sync and checkpoints, which neither overlaps).
ROLLOUT_SIDE = ROLLOUT_FUNCTIONS - {"sync_weights"}
TRAIN_SIDE = TRAIN_FUNCTIONS - {"save_checkpoint", "load_checkpoint"}


@dataclass(frozen=True)
class LedgerTotals:
    """What a job's savings depend on, summed once over its usage rows (``ledger_totals``), so that
    a ledger read often (the platform's savings report and job pages) is not read row by row each
    time: the figures follow from these and the job's declared reservation and mode."""

    rows: int = 0
    device_seconds: float = 0.0  # billed: the rows' device-seconds, switches included
    span_s: float = 0.0  # from the first call's readiness (its start less its wait) to the last end
    shared_s: float = 0.0  # what sharing added: each call's wait for its groups and its switch-in
    rollout_busy_s: float = 0.0  # each call's compute (end - start - setup), by side of an async split
    train_busy_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ledger_totals(rows: list[dict[str, Any]]) -> LedgerTotals:
    """The totals of one job's usage rows (dicts with ``call, fn, start, end, queued_s, setup_s,
    device_seconds``). A call held by two groups has a row each: its wait, switch and compute count
    once (its last row's), its device-seconds on both."""
    if not rows:
        return LedgerTotals()
    calls = {r["call"]: r for r in rows}
    return LedgerTotals(
        rows=len(rows),
        device_seconds=sum(r["device_seconds"] for r in rows),
        span_s=max(r["end"] for r in rows) - min(r["start"] - r["queued_s"] for r in rows),
        shared_s=sum(r["queued_s"] + r["setup_s"] for r in calls.values()),
        rollout_busy_s=sum(r["end"] - r["start"] - r["setup_s"] for r in calls.values() if r["fn"] in ROLLOUT_SIDE),
        train_busy_s=sum(r["end"] - r["start"] - r["setup_s"] for r in calls.values() if r["fn"] in TRAIN_SIDE),
    )


def savings_of_totals(totals: LedgerTotals, reserved_devices: int, mode: str = "isolated_split") -> dict[str, Any]:
    """Billed device-hours against the dedicated counterfactual of one job's ledger totals, declared
    reservation and deployment mode (``isolated_split``, ``async_split``, ``colocated``).

    Billed: device-seconds of the job's calls, switches included. Counterfactual: the declared
    reservation held for the wall time the job would have taken alone: its span less what sharing
    added (each call's wait for its groups once it could run, and its switch-in time); for an async
    split, less also the overlap of its generation with its training passes."""
    if not totals.rows:
        return {"billed_device_hours": 0.0, "counterfactual_device_hours": 0.0, "savings": None,
                "isolated_wall_seconds": 0.0, "counterfactual_wall_seconds": 0.0}
    billed = totals.device_seconds
    isolated = max(0.0, totals.span_s - totals.shared_s)
    wall = isolated
    if mode == "async_split":
        # one step off-policy: the rollout side's generation overlaps the train side's passes, so
        # the shorter side's busy time comes off the sequential wall (never below the longer side)
        rollout, train = totals.rollout_busy_s, totals.train_busy_s
        wall = max(isolated - min(rollout, train), rollout, train)
    counterfactual = reserved_devices * wall
    return {
        "billed_device_hours": billed / 3600,
        "counterfactual_device_hours": counterfactual / 3600,
        "isolated_wall_seconds": isolated,
        "counterfactual_wall_seconds": wall,
        "savings": 1 - billed / counterfactual if counterfactual > 0 else None,
    }


def savings_of_rows(rows: list[dict[str, Any]], reserved_devices: int, mode: str = "isolated_split") -> dict[str, Any]:
    """``savings_of_totals`` of one job's usage rows (``ledger_totals``). Used by the platform's
    billing (measured rows) and by pre-run estimates (predicted rows, ``engine.accounting.estimate``)."""
    return savings_of_totals(ledger_totals(rows), reserved_devices, mode)


def record_rows(records: Iterable[UsageRecord]) -> list[dict[str, Any]]:
    """Usage records as the rows ``savings_of_rows`` reads."""
    return [{**r.to_dict(), "device_seconds": r.device_seconds} for r in records]
