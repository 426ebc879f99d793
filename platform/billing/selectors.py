"""Reads on the usage ledger: every query starts from an organization (or a job of one)."""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Any

from django.db.models import Sum

from accounts.models import Organization
from billing.models import UsageEntry


def month_bounds(when: dt.datetime) -> tuple[float, float]:
    """The calendar month (UTC) holding ``when``, as Unix seconds [start, end)."""
    start = dt.datetime(when.year, when.month, 1, tzinfo=dt.UTC)
    days = calendar.monthrange(when.year, when.month)[1]
    return start.timestamp(), (start + dt.timedelta(days=days)).timestamp()


def device_hours_in_month(*, organization: Organization, when: dt.datetime) -> float:
    """Device-hours billed to the organization for calls that started in ``when``'s month."""
    lo, hi = month_bounds(when)
    total = UsageEntry.objects.filter(organization=organization, start__gte=lo, start__lt=hi).aggregate(
        s=Sum("device_seconds"))["s"]
    return (total or 0.0) / 3600


def job_savings(*, job: Any) -> dict[str, Any]:
    """Billed device-hours against the dedicated counterfactual (DESIGN section 5).

    Billed: device-seconds of the job's calls, switches included. Counterfactual: the job's
    declared reservation (rollout + train devices) held for the wall time it would have taken alone:
    its span on the shared groups less what sharing added (each call's wait for its groups once it
    could run, and its switch-in time). Savings = 1 - billed / counterfactual."""
    rows = list(UsageEntry.objects.filter(job=job).values("call", "start", "end", "queued_s", "setup_s",
                                                          "device_seconds"))
    billed = sum(r["device_seconds"] for r in rows)
    if not rows:
        return {"billed_device_hours": 0.0, "counterfactual_device_hours": 0.0, "savings": None,
                "isolated_wall_seconds": 0.0}
    calls = {r["call"]: r for r in rows}  # a call held by two groups has a row each; count it once
    span = max(r["end"] for r in rows) - min(r["start"] - r["queued_s"] for r in rows)
    shared_cost = sum(r["queued_s"] + r["setup_s"] for r in calls.values())
    isolated = max(0.0, span - shared_cost)
    counterfactual = job.reserved_devices * isolated
    return {
        "billed_device_hours": billed / 3600,
        "counterfactual_device_hours": counterfactual / 3600,
        "isolated_wall_seconds": isolated,
        "savings": 1 - billed / counterfactual if counterfactual > 0 else None,
    }
