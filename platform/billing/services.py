"""Writes of the billing app: the per-job totals of the usage ledger, kept with the ledger."""

from __future__ import annotations

from billing.models import JobUsageTotals, UsageEntry
from billing.selectors import SAVINGS_FIELDS, usage_totals_of_rows


def usage_totals_refresh(*, job_id: int) -> JobUsageTotals:
    """Sum the job's ledger again into its ``JobUsageTotals``. Called by the event ingest inside
    the transaction that stored usage rows or marked them redone, with the job's row locked, so the
    totals change with the ledger and never lag it."""
    rows = list(UsageEntry.objects.filter(job_id=job_id).order_by("seq").values(*SAVINGS_FIELDS))
    totals, _ = JobUsageTotals.objects.update_or_create(job_id=job_id, defaults=usage_totals_of_rows(rows))
    return totals
