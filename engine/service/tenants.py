"""What the platform last told the engine about each tenant, kept so that a new scheduler has it.

The platform pushes a tenant's weight (its fair share of the worker groups) and budget (the
device-seconds its jobs may still use) to the controller, which hands them to the scheduler. The
scheduler keeps them in memory only; the controller (``engine.service.controller``) records each
push here, with the scheduler's clock time of the push, in a small JSON file under its data
directory (replaced atomically), so that a scheduler started after one died, by this controller
or by one started after it, gets them before it dispatches a call.

A budget is not handed back as pushed: the tenant's calls spent some of it since. The usage
records of calls that ended after the push are in the jobs' event logs (``usage`` events, on the
scheduler's clock); their device-seconds come off. Calls whose records never reached a log (a
driver killed before logging them) are not counted: the rebuilt budget may be that much too high.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from engine.accounting.metering import UsageRecord
from engine.service.eventlog import read_events
from engine.support.atomic_json import write_json

_log = logging.getLogger(__name__)

FILE_NAME = "tenants.json"
MTIME_SLACK_S = 60.0  # a log last written this long before a push may still hold a record after it


class TenantBook:
    """Each tenant's last pushed weight and budget, and when (the scheduler's clock) it was pushed."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / FILE_NAME
        self.tenants: dict[str, dict[str, Any]] = {}  # tenant -> {"weight", "budget", "at"}
        try:
            self.tenants = json.loads(self.path.read_text())["tenants"]
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:  # never written by this code: start afresh
            _log.warning("engine: ignoring unreadable %s (%s)", self.path, exc)

    def pushed(self, tenant: str, *, budget: float | None, at: float, weight: float | None = None) -> None:
        """``tenant``'s budget (None: no limit) was set at scheduler time ``at``; its weight too,
        unless None (kept as it was, 1 if never pushed). Written through to the file."""
        entry = self.tenants.setdefault(tenant, {"weight": 1.0})
        if weight is not None:
            entry["weight"] = float(weight)
        entry["budget"] = None if budget is None else float(budget)
        entry["at"] = float(at)
        self._save()

    def _save(self) -> None:
        write_json(self.path, {"tenants": self.tenants}, sort_keys=True)

    def for_scheduler(self) -> dict[str, dict[str, float | None]]:
        """``{tenant: {"weight", "budget"}}`` for a scheduler starting now: each budget less the
        device-seconds of the tenant's usage records that ended after it was pushed."""
        since = {t: e["at"] for t, e in self.tenants.items() if e.get("budget") is not None}
        used = used_since(self.data_dir / "jobs", since)
        return {t: {"weight": e.get("weight", 1.0),
                    "budget": None if e.get("budget") is None else e["budget"] - used.get(t, 0.0)}
                for t, e in self.tenants.items()}


def used_since(jobs_dir: Path, since: dict[str, float]) -> dict[str, float]:
    """Device-seconds of the usage records in the job logs under ``jobs_dir`` of each tenant in
    ``since`` whose call ended after its time there. Logs not written to since are not read."""
    used = dict.fromkeys(since, 0.0)
    if not since or not jobs_dir.is_dir():
        return used
    oldest = min(since.values()) - MTIME_SLACK_S
    for path in jobs_dir.glob("*/events.jsonl"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < oldest:
                continue
            for event in read_events(path):
                if event["kind"] != "usage":
                    continue
                record = UsageRecord.from_dict(event["data"])
                if record.tenant in since and record.end > since[record.tenant]:
                    used[record.tenant] += record.device_seconds
    return used
