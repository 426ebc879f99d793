"""Reads on the usage ledger: every query starts from an organization (or a job of one)."""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Any

from django.db.models import QuerySet, Sum

from accounts.models import Organization
from billing.models import UsageEntry
from jobs.models import Job


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


def _savings(rows: list[dict[str, Any]], reserved_devices: int) -> dict[str, Any]:
    """``job_savings`` of one job's usage rows (``_SAVINGS_FIELDS``) and declared reservation."""
    billed = sum(r["device_seconds"] for r in rows)
    if not rows:
        return {"billed_device_hours": 0.0, "counterfactual_device_hours": 0.0, "savings": None,
                "isolated_wall_seconds": 0.0}
    calls = {r["call"]: r for r in rows}  # a call held by two groups has a row each; count it once
    span = max(r["end"] for r in rows) - min(r["start"] - r["queued_s"] for r in rows)
    shared_cost = sum(r["queued_s"] + r["setup_s"] for r in calls.values())
    isolated = max(0.0, span - shared_cost)
    counterfactual = reserved_devices * isolated
    return {
        "billed_device_hours": billed / 3600,
        "counterfactual_device_hours": counterfactual / 3600,
        "isolated_wall_seconds": isolated,
        "savings": 1 - billed / counterfactual if counterfactual > 0 else None,
    }


_SAVINGS_FIELDS = ("call", "start", "end", "queued_s", "setup_s", "device_seconds")


def job_savings(*, job: Any) -> dict[str, Any]:
    """Billed device-hours against the dedicated counterfactual (DESIGN section 5).

    Billed: device-seconds of the job's calls, switches included. Counterfactual: the job's
    declared reservation (rollout + train devices) held for the wall time it would have taken alone:
    its span on the shared groups less what sharing added (each call's wait for its groups once it
    could run, and its switch-in time). Savings = 1 - billed / counterfactual."""
    rows = list(UsageEntry.objects.filter(job=job).values(*_SAVINGS_FIELDS))
    return _savings(rows, job.reserved_devices)


def usage_of(*, organization: Organization, job: int | None = None) -> QuerySet[UsageEntry]:
    """The organization's usage ledger, by job and seq; ``job``: one of its jobs (an id) only."""
    entries = UsageEntry.objects.filter(organization=organization)
    if job is not None:
        entries = entries.filter(job_id=job)
    return entries.order_by("job_id", "seq")


def savings_of(*, organization: Organization) -> dict[str, Any]:
    """``job_savings`` of each of the organization's jobs (newest first) and the totals, in two
    queries: ``{"jobs": [{"job", "name", "state", <job_savings>}...], "totals": {...}}``.
    Total savings = 1 - all billed / all counterfactual device-hours (None when nothing ran)."""
    rows: dict[int, list[dict[str, Any]]] = {}
    for row in UsageEntry.objects.filter(organization=organization).values("job_id", *_SAVINGS_FIELDS):
        rows.setdefault(row["job_id"], []).append(row)
    jobs = []
    for job in Job.objects.filter(organization=organization).order_by("-created_at", "-id"):
        jobs.append({"job": job.pk, "name": job.name, "state": job.state,
                     **_savings(rows.get(job.pk, []), job.reserved_devices)})
    billed = sum(j["billed_device_hours"] for j in jobs)
    counterfactual = sum(j["counterfactual_device_hours"] for j in jobs)
    totals = {"jobs": len(jobs), "billed_device_hours": billed, "counterfactual_device_hours": counterfactual,
              "savings": 1 - billed / counterfactual if counterfactual > 0 else None}
    return {"jobs": jobs, "totals": totals}
