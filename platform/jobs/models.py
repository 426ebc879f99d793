"""Jobs: an organization's RLVR runs, their lifecycle, and what their event logs reported.

The engine's event log is the source of truth; these tables are what the platform ingested from it
by cursor (``Job.event_cursor``), upserted by (job, seq) so a replayed pull changes nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Priority


class JobState(models.TextChoices):
    QUEUED = "queued"
    PROFILING = "profiling"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.PROFILING, JobState.RUNNING, JobState.PAUSED})


class DeploymentMode(models.TextChoices):
    """How the job would run on devices of its own: the counterfactual its savings compare with."""

    ASYNC_SPLIT = "async_split"
    ISOLATED_SPLIT = "isolated_split"
    COLOCATED = "colocated"


class Job(models.Model):
    organization = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="jobs")
    name = models.CharField(max_length=200, blank=True)
    spec = models.JSONField(help_text="The engine's JobSpec, validated and normalised (JobSpec.to_dict()).")
    # the reservation it would hold on a dedicated deployment (the savings counterfactual)
    rollout_devices = models.PositiveIntegerField(default=1)
    train_devices = models.PositiveIntegerField(default=1)
    deployment_mode = models.CharField(max_length=20, choices=DeploymentMode.choices,
                                       default=DeploymentMode.ASYNC_SPLIT)
    estimate = models.JSONField(null=True, blank=True, help_text="The pre-run estimate made on submit "
                                "(billing.selectors.estimate_figures): dedicated and multiplexed device-hours, "
                                "savings, step seconds, basis.")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    state_reason = models.TextField(blank=True)
    paused_by_quota = models.BooleanField(default=False, help_text="Paused because the budget ran out.")
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL,
                                help_text="Its priority within the organization's share, up to what the plan allows.")
    waiting_for_slot = models.BooleanField(
        default=False, help_text="Held queued by the plan's concurrent-job limit: not sent to the engine yet; "
                                 "it starts, in submission order, when a slot frees.")
    parent = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="children",
                               help_text="The job of the same organization whose weights it started from.")
    parent_weights = models.CharField(max_length=16, blank=True, help_text="Which of the parent's weights: "
                                                                           "final, or its latest checkpoint.")
    event_cursor = models.BigIntegerField(default=0, help_text="Last event seq ingested from the engine.")
    events_complete = models.BooleanField(default=False, help_text="The engine is done with it and every event "
                                                                   "of its log is ingested.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=("organization", "state")),)

    def __str__(self) -> str:
        return f"{self.engine_id} ({self.state})"

    @property
    def engine_id(self) -> str:
        """The job's id in the engine (its event log's folder): stable, unique, never reused."""
        return f"job-{self.pk}"

    @property
    def reserved_devices(self) -> int:
        return self.rollout_devices + self.train_devices


class JobMetric(models.Model):
    """One step's metrics (the engine's ``metrics`` event)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    seq = models.BigIntegerField()
    data = models.JSONField()

    class Meta:
        ordering = ("job", "step")
        constraints = (models.UniqueConstraint(fields=("job", "step"), name="jobmetric_unique_step"),)

    def __str__(self) -> str:
        return f"{self.job_id} step {self.step}"


class JobEvent(models.Model):
    """Any other event of the job's log (state changes, log lines, spec, summary, timings)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    data = models.JSONField()
    ts = models.FloatField(help_text="Engine wall clock (Unix seconds) when the event was written.")

    class Meta:
        ordering = ("job", "seq")
        constraints = (models.UniqueConstraint(fields=("job", "seq"), name="jobevent_unique_seq"),)

    def __str__(self) -> str:
        return f"{self.job_id}#{self.seq} {self.kind}"


class Dataset(models.Model):
    """An organization's own problems (the ``dataset`` task): a JSONL file of ``{"prompt", "answer"}``
    lines under ``PLEXRL_HOME/datasets/<organization id>/``, validated on upload by the engine's
    loader. Written and deleted through ``jobs.datasets`` (the file and the row go together)."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, related_name="datasets")
    name = models.CharField(max_length=200)
    path = models.CharField(max_length=1000, unique=True, help_text="The stored JSONL file (absolute).")
    problems = models.PositiveIntegerField(help_text="How many problems the file holds.")
    size_bytes = models.PositiveBigIntegerField()
    eval_path = models.CharField(max_length=1000, blank=True, help_text="Its evaluation file (absolute; blank: "
                                                                         "jobs evaluate on a held-out split).")
    eval_problems = models.PositiveIntegerField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="datasets")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at", "-id")
        constraints = (
            models.UniqueConstraint(fields=("organization", "name"), name="dataset_unique_name_per_organization"),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.problems} problems)"


class RegisteredModel(models.Model):
    """A Hugging Face model folder a job may name (its ``spec.model``): one an organization's member
    uploaded (``organization`` set: that organization's alone, under ``PLEXRL_HOME/model-uploads/``)
    or one platform staff published to every organization (``organization`` null: a server folder
    they registered, or an upload they published). The engine's built-in presets are listed beside
    them. An organization's own model shadows a published one of the same name."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.PROTECT, null=True, blank=True,
                                     related_name="models",
                                     help_text="The organization that uploaded it; empty: published to every one.")
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=1000, help_text="The model folder (absolute): config.json, "
                                                       "*.safetensors weights and a tokenizer.")
    description = models.TextField(blank=True)
    architecture = models.CharField(max_length=100, blank=True, help_text="config.json's architecture, as checked "
                                                                           "on upload (blank: registered unchecked).")
    parameters = models.PositiveBigIntegerField(null=True, blank=True)
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=16, blank=True)
    registered_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                      related_name="registered_models")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name", "id")
        constraints = (
            models.UniqueConstraint(fields=("name",), condition=models.Q(organization__isnull=True),
                                    name="model_unique_published_name"),
            models.UniqueConstraint(fields=("organization", "name"), condition=models.Q(organization__isnull=False),
                                    name="model_unique_name_per_organization"),
        )

    def __str__(self) -> str:
        return self.name
