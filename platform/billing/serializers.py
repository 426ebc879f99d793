"""Output shapes of the billing API (``billing.views``)."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.api import ModelSerializer
from billing.models import UsageEntry
from jobs.models import JobState


class UsageFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET billing/usage/``."""

    job = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="One job's entries only."
    )


class UsageEntrySerializer(ModelSerializer):
    """One metered call on one WPG: ``devices`` held from ``start`` to ``end`` (Unix seconds)."""

    class Meta:
        model = UsageEntry
        fields = (
            "id",
            "job",
            "seq",
            "call",
            "role",
            "fn",
            "wpg",
            "devices",
            "start",
            "end",
            "setup_s",
            "exec_s",
            "queued_s",
            "device_seconds",
            "redone",
        )
        read_only_fields = fields


class SavingsFiguresSerializer(serializers.Serializer):
    """Billed device-hours against the dedicated counterfactual (``billing.selectors``' savings);
    ``savings`` is null when nothing ran. Every savings shape of the API extends this one."""

    billed_device_hours = serializers.FloatField()
    counterfactual_device_hours = serializers.FloatField()
    savings = serializers.FloatField(allow_null=True)
    redone_device_hours = serializers.FloatField(
        help_text="Work an engine recovery threw away and the job did again: used, not billed.")


class JobSavingsSerializer(SavingsFiguresSerializer):
    """One job's savings row."""

    job = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    estimated_device_hours = serializers.FloatField(
        allow_null=True, help_text="The pre-run estimate of the billed device-hours (null: made before estimates).")

    CSV_FIELDS = ("job", "name", "state", "estimated_device_hours", "billed_device_hours",
                  "counterfactual_device_hours", "savings", "redone_device_hours")


class SavingsTotalsSerializer(SavingsFiguresSerializer):
    jobs = serializers.IntegerField()


class SavingsReportSerializer(serializers.Serializer):
    """Every job of the organization, newest first, and the totals."""

    jobs = JobSavingsSerializer(many=True)
    totals = SavingsTotalsSerializer()


@extend_schema_field({"type": "string", "pattern": r"^\d{4}-\d{2}$", "example": "2026-01"})
class MonthField(serializers.Field):
    """A calendar month (UTC) as ``YYYY-MM``; the internal value is its first day (a date)."""

    def to_internal_value(self, data):
        from billing.selectors import parse_month

        try:
            return parse_month(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value):
        return f"{value.year:04d}-{value.month:02d}"


class MonthQuerySerializer(serializers.Serializer):
    """Query parameters of the monthly reports (``billing/summary/``, ``billing/cluster/``)."""

    month = MonthField(required=False, help_text="A calendar month (UTC), YYYY-MM. Default: the current month.")


class JobMonthSerializer(serializers.Serializer):
    """One job's device-hours in the month (its calls that started in it)."""

    job = serializers.IntegerField()
    name = serializers.CharField()
    device_hours = serializers.FloatField()
    calls = serializers.IntegerField()
    redone_device_hours = serializers.FloatField(
        help_text="Work an engine recovery threw away and the job did again: used, not billed.")


class MonthlySummarySerializer(serializers.Serializer):
    """The organization's device-hours in one calendar month (UTC), by call start time."""

    month = serializers.CharField(help_text="YYYY-MM")
    device_hours = serializers.FloatField()
    calls = serializers.IntegerField(help_text="Calls made (a call on two groups counts once).")
    redone_device_hours = serializers.FloatField(
        help_text="Work an engine recovery threw away and the job did again: used, not billed.")
    jobs = JobMonthSerializer(many=True, help_text="Jobs with usage in the month, most device-hours first.")


class OrganizationMonthSerializer(serializers.Serializer):
    """One organization's device-hours in the month and its savings against the dedicated counterfactual."""

    organization = serializers.IntegerField()
    name = serializers.CharField()
    device_hours = serializers.FloatField()
    jobs = serializers.IntegerField(help_text="Jobs with usage in the month.")
    counterfactual_device_hours = serializers.FloatField()
    savings = serializers.FloatField(allow_null=True)
    redone_device_hours = serializers.FloatField(
        help_text="Work an engine recovery threw away and the job did again: used, not billed.")


class ClusterSummarySerializer(serializers.Serializer):
    """The whole cluster in one calendar month (UTC): capacity, billed, and the idle row."""

    month = serializers.CharField(help_text="YYYY-MM")
    capacity_device_hours = serializers.FloatField(help_text="From the capacity samples (a step function).")
    billed_device_hours = serializers.FloatField()
    redone_device_hours = serializers.FloatField(
        help_text="Work engine recoveries threw away and jobs did again: used, not billed.")
    idle_device_hours = serializers.FloatField(
        help_text="Capacity nobody used: capacity - billed - redone, never negative.")
    over_capacity = serializers.BooleanField(help_text="More was used than the samples show as capacity.")
    over_capacity_device_hours = serializers.FloatField(
        help_text="Billed + redone - capacity when over capacity, else 0.")
    organizations = OrganizationMonthSerializer(many=True)


class ClusterRowSerializer(serializers.Serializer):
    """A row of the cluster report as CSV: an organization, the ``redone`` row (work recoveries
    redid, not billed), the ``idle`` row, or ``over_capacity``."""

    kind = serializers.ChoiceField(choices=("organization", "redone", "idle", "over_capacity"))
    organization = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    device_hours = serializers.FloatField()
    counterfactual_device_hours = serializers.FloatField(allow_null=True)
    savings = serializers.FloatField(allow_null=True)
