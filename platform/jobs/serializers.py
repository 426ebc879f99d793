"""Input and output shapes of the jobs API (``jobs.views``).

Input serializers check shapes only (types, ranges, unknown fields via ``StrictFieldsMixin``); the
spec itself is validated by the engine's ``JobSpec`` in ``services.job_create``, whose errors come
back as field errors named ``spec.<field>``.
"""

import copy

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.api import ModelSerializer, StrictFieldsMixin
from accounts.models import Priority
from billing.selectors import job_savings
from billing.serializers import SavingsFiguresSerializer
from engine.spec import spec_json_schema
from jobs.lineage import lineage as lineage_of
from jobs.models import DeploymentMode, Job, JobEvent, JobMetric, JobState
from jobs.services import MAX_DEVICES_DECLARED


def _devices_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1,
        max_value=MAX_DEVICES_DECLARED,
        default=1,
        help_text="Devices the job would reserve for this role on a dedicated deployment (the savings counterfactual).",
    )


# --- the job spec -------------------------------------------------------------------------------

# Spec fields the platform sets itself, never a tenant (the reason is the API's refusal).
PLATFORM_SET_SPEC_FIELDS = {
    "eval_dataset": "comes with the dataset (its evaluation file), not by hand",
    "init_from": "set from continue_from (a job of the organization), not by hand",
}


def api_spec_schema() -> dict:
    """The job spec as the API takes it: the engine's own schema (``engine.spec.spec_json_schema``:
    every field typed, with its default, bounds and description), but ``dataset`` is the id of one
    of the organization's datasets (the platform puts in its file) and the platform-set fields are
    not a tenant's to give."""
    schema = copy.deepcopy(spec_json_schema())
    properties = schema["properties"]
    properties["dataset"] = {"type": "integer", "nullable": True, "default": None, "x-label": "Dataset",
                             "description": "Task dataset: the id of one of your organization's datasets "
                                            "(GET datasets/)."}
    for name in PLATFORM_SET_SPEC_FIELDS:
        del properties[name]
    return schema


@extend_schema_field(api_spec_schema())
class SpecField(serializers.DictField):
    """A job spec: an object, validated by the engine's ``JobSpec`` (``services.job_create``); typed
    in the OpenAPI schema field by field."""


# --- input --------------------------------------------------------------------------------------


class JobCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST jobs/``: a new job of the current organization."""

    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    spec = SpecField(help_text="The job's spec: task, model, steps, seed, grpo {...}, rollout, trainer, tp, tools.")
    rollout_devices = _devices_field()
    train_devices = _devices_field()
    deployment_mode = serializers.ChoiceField(choices=DeploymentMode.choices, default=DeploymentMode.ASYNC_SPLIT)
    priority = serializers.ChoiceField(
        choices=Priority.choices, default=Priority.NORMAL,
        help_text="Its priority within the organization's share of the devices, up to the plan's max_priority.")
    continue_from = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1,
        help_text="A job of the organization whose weights it starts from (its spec then names no model).")
    continue_weights = serializers.ChoiceField(
        choices=(("final", "final"), ("checkpoint", "checkpoint")), default="final",
        help_text="The parent's final weights (it succeeded) or its latest checkpoint.")


class JobCancelSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST jobs/{id}/cancel/``: an optional reason, kept as the job's ``state_reason``."""

    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


# the list's sortable columns (``?ordering=``), as ``jobs.selectors.jobs_of`` orders them
JOB_ORDERINGS = ("created_at", "latest_reward", "eval_accuracy", "device_hours", "last_step", "name")


class JobFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET jobs/``."""

    state = serializers.ChoiceField(
        choices=JobState.choices, required=False, allow_blank=True, help_text="Only jobs in this state."
    )
    search = serializers.CharField(
        max_length=200, required=False, allow_blank=True, help_text="A piece of the job's name."
    )
    ordering = serializers.ChoiceField(
        choices=[f"{sign}{key}" for key in JOB_ORDERINGS for sign in ("", "-")], required=False, allow_blank=True,
        help_text="Sort by this column, largest first with a leading '-' (jobs without the number last either "
                  "way); default: newest first.",
    )


class EventFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET jobs/{id}/events/``."""

    after_seq = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, default=0, help_text="Only events after this seq (a cursor)."
    )
    kind = serializers.CharField(
        max_length=32, required=False, allow_blank=True, help_text="Only events of this kind (state, log, ...)."
    )


# --- output -------------------------------------------------------------------------------------


class SavingsSerializer(SavingsFiguresSerializer):
    """A job's savings so far, with the wall time it would have taken alone."""

    isolated_wall_seconds = serializers.FloatField()


class EstimateSerializer(serializers.Serializer):
    """A job's pre-run estimate (``POST jobs/estimate/``, and ``estimate`` of a job made since):
    the device-hours it would hold on its declared dedicated deployment and what it would be billed
    multiplexed, both through billing's savings function."""

    dedicated_device_hours = serializers.FloatField()
    multiplexed_device_hours = serializers.FloatField()
    savings = serializers.FloatField(allow_null=True)
    step_seconds = serializers.FloatField(help_text="Predicted wall seconds per step, the job alone.")
    basis = serializers.ChoiceField(choices=("profile", "model"), help_text="'profile': scaled from a finished "
                                    "job of the same shape; 'model': the calibrated cost model.")


class JobSerializer(ModelSerializer):
    """A job in a list (no spec, no savings)."""

    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)
    last_step = serializers.IntegerField(
        read_only=True, allow_null=True, default=None, help_text="The highest step that reported metrics."
    )
    latest_reward = serializers.FloatField(read_only=True, allow_null=True, default=None,
                                           help_text="The mean reward of the latest step that reported one.")
    eval_accuracy = serializers.FloatField(read_only=True, allow_null=True, default=None,
                                           help_text="The held-out accuracy of the latest evaluation.")
    device_hours = serializers.SerializerMethodField(help_text="Device-hours billed so far (null: none yet).")

    class Meta:
        model = Job
        fields = (
            "id",
            "name",
            "state",
            "state_reason",
            "rollout_devices",
            "train_devices",
            "deployment_mode",
            "priority",
            "waiting_for_slot",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "last_step",
            "latest_reward",
            "eval_accuracy",
            "device_hours",
        )
        read_only_fields = fields

    # the columns a list of them reads (``QuerySet.only``): the fields above, the creator's name,
    # the billed device-seconds
    COLUMNS = (*(f for f in Meta.fields if f not in ("created_by", "last_step", "latest_reward", "eval_accuracy",
                                                     "device_hours")),
               "created_by__username", "usage_totals__device_seconds")

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_device_hours(self, job: Job) -> float | None:
        totals = getattr(job, "usage_totals", None)  # (None: no usage ingested yet)
        return None if totals is None else totals.device_seconds / 3600.0


class LineageJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(allow_blank=True)
    weights = serializers.CharField(help_text="final, or checkpoint (its latest).")


class LineageSerializer(serializers.Serializer):
    """The job it continued (null: it started from its model) and the jobs that continued it."""

    parent = LineageJobSerializer(allow_null=True)
    children = LineageJobSerializer(many=True)


class JobDetailSerializer(JobSerializer):
    """One job: its spec, reservation, state and savings so far."""

    savings = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = (
            *JobSerializer.Meta.fields[:6],
            "reserved_devices",
            *JobSerializer.Meta.fields[6:],
            "spec",
            "paused_by_quota",
            "updated_at",
            "savings",
            "estimate",
            "lineage",
        )
        read_only_fields = fields

    estimate = EstimateSerializer(read_only=True, allow_null=True, help_text="Made on submit; null for older jobs.")
    lineage = serializers.SerializerMethodField()

    @extend_schema_field(LineageSerializer)
    def get_lineage(self, obj: Job) -> dict:
        return LineageSerializer(lineage_of(job=obj)).data

    @extend_schema_field(SavingsSerializer)
    def get_savings(self, obj: Job) -> dict:
        return SavingsSerializer(job_savings(job=obj)).data


class JobMetricSerializer(ModelSerializer):
    class Meta:
        model = JobMetric
        fields = ("step", "data")
        read_only_fields = fields


class JobEventSerializer(ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ("seq", "kind", "data", "ts")
        read_only_fields = fields


class ConflictSerializer(serializers.Serializer):
    """409: the job's state or the organization's quota does not allow it; ``limit`` names the
    quota limit, when one was hit."""

    detail = serializers.CharField()
    limit = serializers.CharField(required=False)


class ArtifactFileSerializer(serializers.Serializer):
    name = serializers.CharField()
    size_bytes = serializers.IntegerField()
    url = serializers.CharField()


class ArtifactSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="'final': the weights when training ended.")
    format = serializers.CharField(help_text="'huggingface': a folder transformers loads (safetensors).")
    archive_url = serializers.CharField(help_text="The whole folder as one ZIP archive.")
    files = ArtifactFileSerializer(many=True)
