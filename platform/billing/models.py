"""The usage ledger: one row per usage record the engine metered (``engine/accounting/metering.py``).

Rows arrive with the job's event log, keyed by (job, seq) of the ``usage`` event, so the pull can
run any number of times without counting anything twice.

A row the engine's recovery threw away (``redone``: logged after the checkpoint a replaced driver
resumed from) stays on the ledger, as device time the cluster spent, but is not billed: the job
does that work again, and the tenant pays for it once.
"""

from __future__ import annotations

import dataclasses

from django.db import models

from engine.control import LedgerTotals

BILLED = models.Q(redone=False)  # the rows the tenant pays for: all but work a recovery redid


class UsageQuerySet(models.QuerySet):
    def billed(self) -> UsageQuerySet:
        return self.filter(BILLED)


class UsageEntry(models.Model):
    organization = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="usage")
    job = models.ForeignKey("jobs.Job", on_delete=models.PROTECT, related_name="usage")
    seq = models.BigIntegerField(help_text="The usage event's seq in the job's event log.")
    call = models.BigIntegerField(help_text="The scheduler's call id.")
    role = models.CharField(max_length=32)
    fn = models.CharField(max_length=32)
    wpg = models.CharField(max_length=100)
    devices = models.FloatField()
    start = models.FloatField(help_text="When the call got the WPG (Unix seconds).")
    end = models.FloatField()
    setup_s = models.FloatField(default=0.0)
    exec_s = models.FloatField(null=True, blank=True)
    queued_s = models.FloatField(default=0.0, help_text="Seconds the call waited for its WPGs.")
    device_seconds = models.FloatField()
    redone = models.BooleanField(
        default=False, help_text="Work an engine recovery threw away and the job did again: kept, not billed.")

    objects = UsageQuerySet.as_manager()

    class Meta:
        ordering = ("job", "seq")
        constraints = (models.UniqueConstraint(fields=("job", "seq"), name="usage_unique_event"),)
        indexes = (models.Index(fields=("organization", "start")),)

    def __str__(self) -> str:
        return f"{self.job_id}#{self.seq} {self.fn} on {self.wpg}"


class JobUsageTotals(models.Model):
    """One job's usage ledger summed (``engine.accounting.metering.ledger_totals`` of its billed rows, and the
    device-seconds a recovery redid), so its savings are read without reading its rows.

    Written only where the ledger is: the event ingest, in the transaction that stores the rows or
    marks them redone (``billing.services.usage_totals_refresh``). The savings figures follow from
    these and the job's declared reservation and mode (``billing.selectors.job_savings``)."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="usage_totals")
    rows = models.PositiveIntegerField(default=0, help_text="Billed rows.")
    device_seconds = models.FloatField(default=0.0)
    span_s = models.FloatField(default=0.0)
    shared_s = models.FloatField(default=0.0)
    rollout_busy_s = models.FloatField(default=0.0)
    train_busy_s = models.FloatField(default=0.0)
    redone_device_seconds = models.FloatField(default=0.0)

    TOTALS = tuple(f.name for f in dataclasses.fields(LedgerTotals))  # the columns of the billed rows' totals
    FIELDS = (*TOTALS, "redone_device_seconds")  # every column but the job

    def __str__(self) -> str:
        return f"{self.job_id}: {self.device_seconds:g} device-s in {self.rows} rows"


class CapacitySample(models.Model):
    """The cluster's device capacity at one moment, recorded every ``BILLING_CAPACITY_PERIOD_S`` by
    ``billing.tasks.record_capacity`` from the engine's ``cluster_snapshot``.

    Capacity is a step function: a sample's ``devices`` hold until the next sample; the latest one
    holds until now, at most two sampling periods (no sample since: the engine was down, and no
    capacity counts). ``billing.selectors.capacity_device_hours`` integrates it."""

    at = models.DateTimeField(db_index=True)
    devices = models.FloatField(help_text="Device slots of all the engine's groups together.")
    groups = models.JSONField(default=list, help_text="The snapshot's groups (name, side, backend, ranks, devices).")

    class Meta:
        ordering = ("at", "id")

    def __str__(self) -> str:
        return f"{self.devices:g} devices at {self.at.isoformat()}"
