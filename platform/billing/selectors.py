"""Reads on the usage ledger: every query starts from an organization (or a job of one)."""

from __future__ import annotations

import calendar
import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from accounts.models import Organization
from billing.models import BILLED, CapacitySample, JobUsageTotals, UsageEntry
from engine.control import LedgerTotals, estimate, ledger_totals, record_rows, savings_of_rows, savings_of_totals
from engine.spec import JobSpec, ServiceConfig
from jobs.models import Job


def month_bounds(when: dt.datetime) -> tuple[float, float]:
    """The calendar month (UTC) holding ``when``, as Unix seconds [start, end)."""
    start = dt.datetime(when.year, when.month, 1, tzinfo=dt.UTC)
    days = calendar.monthrange(when.year, when.month)[1]
    return start.timestamp(), (start + dt.timedelta(days=days)).timestamp()


def device_hours_in_month(*, organization: Organization, when: dt.datetime) -> float:
    """Device-hours billed to the organization for calls that started in ``when``'s month."""
    lo, hi = month_bounds(when)
    total = UsageEntry.objects.billed().filter(organization=organization, start__gte=lo, start__lt=hi).aggregate(
        s=Sum("device_seconds"))["s"]
    return (total or 0.0) / 3600


# What ``engine.accounting.metering.ledger_totals`` reads of a usage row, and whether it is billed.
SAVINGS_FIELDS = ("call", "fn", "start", "end", "queued_s", "setup_s", "device_seconds", "redone")


def usage_totals_of_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``JobUsageTotals`` fields of one job's ledger rows (``SAVINGS_FIELDS`` dicts): the
    totals of the billed ones, and the device-seconds of those a recovery redid."""
    totals = ledger_totals([r for r in rows if not r["redone"]])
    return {**totals.to_dict(), "redone_device_seconds": sum(r["device_seconds"] for r in rows if r["redone"])}


def _savings(totals: dict[str, Any], reserved_devices: int, mode: str) -> dict[str, Any]:
    """Billed against dedicated (docs/architecture.md §5: ``engine.accounting.metering.savings_of_totals``, shared with
    pre-run estimates) of a job's ledger totals (``JobUsageTotals`` fields, ``usage_totals_of_rows``),
    over the rows billed; ``redone_device_hours``: the work an engine recovery threw away and the job
    did again (on the ledger, not billed)."""
    billed = LedgerTotals(**{name: totals[name] for name in JobUsageTotals.TOTALS})
    return {**savings_of_totals(billed, reserved_devices, mode),
            "redone_device_hours": totals["redone_device_seconds"] / 3600}


def estimate_figures(*, spec: JobSpec, reserved_devices: int, deployment_mode: str) -> dict[str, Any]:
    """A job's pre-run estimate as the bill would state it: the engine's predicted calls
    (``engine.accounting.estimate``: from a profile of the job's shape, else the cost model) as usage rows on
    the engine service's shared groups, through the savings function billing uses.

    ``{"dedicated_device_hours", "multiplexed_device_hours", "savings", "step_seconds", "basis"}``:
    multiplexed is what the job would be billed (its calls' device-hours), dedicated the counterfactual
    of its declared reservation and deployment mode. In-process and cheap (no engine call)."""
    predicted = estimate(spec, home=settings.PLEXRL_HOME)
    rows = record_rows(predicted.usage_records(devices_per_group=ServiceConfig().devices_per_group))
    figures = savings_of_rows(rows, reserved_devices, deployment_mode)
    return {"dedicated_device_hours": figures["counterfactual_device_hours"],
            "multiplexed_device_hours": figures["billed_device_hours"], "savings": figures["savings"],
            "step_seconds": predicted.step_seconds, "basis": predicted.basis}


_NO_USAGE = usage_totals_of_rows([])


def _totals_of(job: Job) -> dict[str, Any]:
    try:
        totals = job.usage_totals  # selected with the job by ``jobs.selectors``, else one query
    except JobUsageTotals.DoesNotExist:
        return _NO_USAGE
    return {name: getattr(totals, name) for name in JobUsageTotals.FIELDS}


def job_savings(*, job: Any) -> dict[str, Any]:
    """Billed device-hours against the dedicated counterfactual (docs/architecture.md §5).

    Billed: device-seconds of the job's calls, switches included. Counterfactual: the job's
    declared reservation (rollout + train devices) held for the wall time it would have taken alone
    in its declared deployment mode: its span on the shared groups less what sharing added (each
    call's wait for its groups once it could run, and its switch-in time); for an async split, less
    also the overlap of its generation with its training passes. Savings = 1 - billed /
    counterfactual. Work an engine recovery redid is neither (``redone_device_hours``). Read from
    the job's ledger totals (``JobUsageTotals``), not its rows."""
    return _savings(_totals_of(job), job.reserved_devices, job.deployment_mode)


def usage_of(*, organization: Organization, job: int | None = None) -> QuerySet[UsageEntry]:
    """The organization's usage ledger, by job and seq; ``job``: one of its jobs (an id) only."""
    entries = UsageEntry.objects.filter(organization=organization)
    if job is not None:
        entries = entries.filter(job_id=job)
    return entries.order_by("job_id", "seq")


_TOTALS_COLUMNS = {f"usage_totals__{name}": name for name in JobUsageTotals.FIELDS}


def savings_of(*, organization: Organization) -> dict[str, Any]:
    """``job_savings`` of each of the organization's jobs (newest first) and the totals, in one
    query over the jobs and their ledger totals: ``{"jobs": [{"job", "name", "state",
    "estimated_device_hours", <job_savings>}...], "totals": {...}}``; ``estimated_device_hours``: the
    pre-run estimate of what it would be billed (null for a job made before estimates).
    Total savings = 1 - all billed / all counterfactual device-hours (None when nothing ran)."""
    jobs = []
    for job in (Job.objects.filter(organization=organization).order_by("-created_at", "-id")
                .values("pk", "name", "state", "rollout_devices", "train_devices", "deployment_mode",
                        "estimate__multiplexed_device_hours", *_TOTALS_COLUMNS)):
        totals = _NO_USAGE if job["usage_totals__rows"] is None else {
            name: job[column] for column, name in _TOTALS_COLUMNS.items()}
        jobs.append({"job": job["pk"], "name": job["name"], "state": job["state"],
                     "estimated_device_hours": job["estimate__multiplexed_device_hours"],
                     **_savings(totals, job["rollout_devices"] + job["train_devices"], job["deployment_mode"])})
    return {"jobs": jobs, "totals": _savings_totals(jobs)}


def _savings_totals(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The totals of ``_savings`` rows: all billed against all counterfactual device-hours."""
    billed = sum(j["billed_device_hours"] for j in jobs)
    counterfactual = sum(j["counterfactual_device_hours"] for j in jobs)
    return {"jobs": len(jobs), "billed_device_hours": billed, "counterfactual_device_hours": counterfactual,
            "savings": 1 - billed / counterfactual if counterfactual > 0 else None,
            "redone_device_hours": sum(j["redone_device_hours"] for j in jobs)}


# --- monthly reports ---------------------------------------------------------------------------


def parse_month(value: str) -> dt.date:
    """``"YYYY-MM"`` as the first day of that month; ValueError for anything else (years 1970-9998)."""
    if not isinstance(value, str) or len(value) != 7 or value[4] != "-" or not (value[:4] + value[5:]).isdigit():
        raise ValueError("Give a month as YYYY-MM.")
    year, month = int(value[:4]), int(value[5:])
    if not 1 <= month <= 12:
        raise ValueError("The month must be 01 to 12.")
    if not 1970 <= year <= 9998:
        raise ValueError("The year must be 1970 to 9998.")
    return dt.date(year, month, 1)


def current_month(now: dt.datetime | None = None) -> dt.date:
    """The calendar month (UTC) holding ``now`` (default: now), as its first day."""
    now = (now or timezone.now()).astimezone(dt.UTC)
    return dt.date(now.year, now.month, 1)


def _month_window(month: dt.date) -> tuple[float, float]:
    return month_bounds(dt.datetime(month.year, month.month, 1, tzinfo=dt.UTC))


def _month_label(month: dt.date) -> str:
    return f"{month.year:04d}-{month.month:02d}"


def monthly_summary(*, organization: Organization, month: dt.date) -> dict[str, Any]:
    """The organization's device-hours in ``month`` (calls by start time, UTC, like
    ``device_hours_in_month``), per job (most device-hours first) and in total; ``calls``: the calls
    made (a call held by two groups has a ledger row each and counts once). Billed only; a job's
    ``redone_device_hours``: work an engine recovery threw away and the job did again, not billed.

    Summed by the database, a row per job: fetching the month's ledger rows cost the API ~0.1 ms a
    row (about 50 ms for 200 jobs of 20 steps)."""
    lo, hi = _month_window(month)
    rows = (UsageEntry.objects.filter(organization=organization, start__gte=lo, start__lt=hi)
            .values("job_id", "job__name")
            .annotate(seconds=Sum("device_seconds", filter=BILLED, default=0.0),
                      redone_seconds=Sum("device_seconds", filter=~BILLED, default=0.0),
                      calls=Count("call", distinct=True, filter=BILLED))
            .order_by())  # no Meta.ordering columns in the GROUP BY
    jobs = [{"job": r["job_id"], "name": r["job__name"], "device_hours": r["seconds"] / 3600, "calls": r["calls"],
             "redone_device_hours": r["redone_seconds"] / 3600} for r in rows]
    jobs.sort(key=lambda j: (-j["device_hours"], j["job"]))
    return {"month": _month_label(month), "device_hours": sum(j["device_hours"] for j in jobs),
            "calls": sum(j["calls"] for j in jobs), "redone_device_hours": sum(j["redone_device_hours"] for j in jobs),
            "jobs": jobs}


def capacity_device_hours(*, lo: float, hi: float, now: dt.datetime | None = None) -> float:
    """Device-hours of capacity in [lo, hi) (Unix seconds), from the ``CapacitySample`` rows.

    A sample's devices hold until the next sample; the latest sample holds until ``now`` but at
    most two sampling periods (``BILLING_CAPACITY_PERIOD_S``): past that the engine was down and no
    capacity counts. Nothing counts after ``now``."""
    now_s = (now or timezone.now()).timestamp()
    hold = 2 * float(settings.BILLING_CAPACITY_PERIOD_S)
    lo_at = dt.datetime.fromtimestamp(lo, dt.UTC)
    hi_at = dt.datetime.fromtimestamp(hi, dt.UTC)
    before = CapacitySample.objects.filter(at__lt=lo_at).order_by("-at", "-id").values_list("at", "devices")[:1]
    inside = CapacitySample.objects.filter(at__gte=lo_at, at__lt=hi_at).order_by("at", "id").values_list(
        "at", "devices")
    after = CapacitySample.objects.filter(at__gte=hi_at).order_by("at", "id").values_list("at", "devices")[:1]
    samples = [(at.timestamp(), devices) for at, devices in (*before, *inside, *after)]
    end = min(hi, now_s)
    total = 0.0
    for i, (at, devices) in enumerate(samples):
        until = samples[i + 1][0] if i + 1 < len(samples) else min(now_s, at + hold)
        start, stop = max(at, lo), min(until, end)
        if stop > start:
            total += devices * (stop - start)
    return total / 3600


def cluster_summary(*, month: dt.date, now: dt.datetime | None = None) -> dict[str, Any]:
    """The whole cluster in ``month`` (platform staff): capacity, what was billed to whom, and the
    idle device-hours nobody used (the platform's own row, docs/architecture.md §5).

    ``idle_device_hours`` = capacity - billed - redone (``redone_device_hours``: work engine
    recoveries threw away and jobs did again, used but not billed), never negative; when more was
    used than the samples show as capacity (samples missing while jobs ran), ``over_capacity`` is true and
    ``over_capacity_device_hours`` says by how much. Each organization's row also has its savings
    over the month: ``_savings`` of each job's calls that started in the month, totalled."""
    lo, hi = _month_window(month)
    capacity = capacity_device_hours(lo=lo, hi=hi, now=now)
    rows: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for row in UsageEntry.objects.filter(start__gte=lo, start__lt=hi).values(
            "organization_id", "job_id", *SAVINGS_FIELDS):
        rows.setdefault(row["organization_id"], {}).setdefault(row["job_id"], []).append(row)
    declared = {job.pk: (job.reserved_devices, job.deployment_mode)
                for job in Job.objects.filter(pk__in={j for jobs in rows.values() for j in jobs}).only(
                    "id", "rollout_devices", "train_devices", "deployment_mode")}
    organizations = []
    for org in Organization.objects.filter(pk__in=rows).order_by("name", "id"):
        jobs = [_savings(usage_totals_of_rows(job_rows), *declared[job_id])
                for job_id, job_rows in rows[org.pk].items()]
        totals = _savings_totals(jobs)
        organizations.append({"organization": org.pk, "name": org.name,
                              "device_hours": totals["billed_device_hours"], "jobs": totals["jobs"],
                              "counterfactual_device_hours": totals["counterfactual_device_hours"],
                              "savings": totals["savings"], "redone_device_hours": totals["redone_device_hours"]})
    billed = sum(o["device_hours"] for o in organizations)
    redone = sum(o["redone_device_hours"] for o in organizations)
    used = billed + redone
    excess = used - capacity if used - capacity > 1e-9 else 0.0  # float noise is not an overrun
    return {"month": _month_label(month), "capacity_device_hours": capacity, "billed_device_hours": billed,
            "redone_device_hours": redone, "idle_device_hours": max(0.0, capacity - used),
            "over_capacity": excess > 0,
            "over_capacity_device_hours": excess, "organizations": organizations}


def budget_left_s(organization: Organization, now: dt.datetime | None = None) -> float | None:
    """Device-seconds the organization may still use this month (None: its plan sets no budget):
    what ``billing.tasks.push_tenant`` and a job's launch send to the engine."""
    budget = organization.plan.device_hours_per_month
    if budget is None:
        return None
    return (float(budget) - device_hours_in_month(organization=organization, when=now or timezone.now())) * 3600
