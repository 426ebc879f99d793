"""Output shapes of the billing API (``billing.views``)."""

from rest_framework import serializers

from billing.models import UsageEntry
from jobs.models import JobState


class UsageFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET billing/usage/``."""

    job = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="One job's entries only."
    )


class UsageEntrySerializer(serializers.ModelSerializer):
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
        )
        read_only_fields = fields


class JobSavingsSerializer(serializers.Serializer):
    """One job's billed device-hours against its dedicated counterfactual (null savings: nothing ran)."""

    job = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    billed_device_hours = serializers.FloatField()
    counterfactual_device_hours = serializers.FloatField()
    savings = serializers.FloatField(allow_null=True)


class SavingsTotalsSerializer(serializers.Serializer):
    jobs = serializers.IntegerField()
    billed_device_hours = serializers.FloatField()
    counterfactual_device_hours = serializers.FloatField()
    savings = serializers.FloatField(allow_null=True)


class SavingsReportSerializer(serializers.Serializer):
    """Every job of the organization, newest first, and the totals."""

    jobs = JobSavingsSerializer(many=True)
    totals = SavingsTotalsSerializer()
