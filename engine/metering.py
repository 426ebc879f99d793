"""Metering: the usage record every executed call yields, shared by live billing and the simulator.

A record says which job used which WPG's devices, for which function, from when to when, and how
much of that was switching the job's state in (setup). Billing is device-seconds of these records;
the same code runs on the live engine's wall clock and on the simulator's virtual clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class UsageRecord:
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
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageRecord:
        return cls(**data)


def device_seconds(records: Iterable[UsageRecord], *, job: str | None = None) -> float:
    """Device-seconds billed for ``records`` (those of ``job`` when given), setup included."""
    return sum(r.device_seconds for r in records if job is None or r.job == job)
