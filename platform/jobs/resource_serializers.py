"""Input and output shapes of the datasets, models and cluster endpoints (``jobs.resource_views``)."""

from rest_framework import serializers

from accounts.api import ModelSerializer, StrictFieldsMixin
from engine.control import DATASET_FIELDS, DATASET_FORMATS
from jobs.cluster import TIMELINE_MAX_WINDOW_S, TIMELINE_WINDOW_S
from jobs.models import Dataset, JobState

# --- datasets -------------------------------------------------------------------------------------


class DatasetUploadSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST datasets/`` (multipart): a name and a file of problems (JSONL, CSV or Parquet), its
    prompt and answer in the fields or columns named."""

    name = serializers.CharField(max_length=200, help_text="Unique within the organization.")
    file = serializers.FileField(help_text="JSONL (one {\"prompt\": ..., \"answer\": ...} object a line), CSV "
                                 "(a header line, then a problem a record) or Parquet.")
    format = serializers.ChoiceField(choices=DATASET_FORMATS, required=False,
                                     help_text="Default: from the file's name (.csv, .parquet; JSONL otherwise).")
    prompt_column = serializers.CharField(max_length=200, default=DATASET_FIELDS[0],
                                          help_text="The field or column holding the prompt.")
    answer_column = serializers.CharField(max_length=200, default=DATASET_FIELDS[1],
                                          help_text="The field or column holding the answer (text or a number); "
                                          "a table's other columns are left out.")
    eval_file = serializers.FileField(required=False, help_text="Optional problems to evaluate on, in the same "
                                      "format and columns (the whole file then trains; without it, a held-out "
                                      "split of the file).")


class DatasetSerializer(ModelSerializer):
    """A dataset; a job trains on it with ``{"task": "dataset", "dataset": <id>, "model": ...}``."""

    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Dataset
        fields = ("id", "name", "problems", "eval_problems", "size_bytes", "created_by", "created_at")
        read_only_fields = fields


# --- models ---------------------------------------------------------------------------------------


class ModelRegisterSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST models/`` (platform staff): a local Hugging Face model folder, by name."""

    name = serializers.CharField(max_length=100, help_text="What job specs call it (spec.model).")
    path = serializers.CharField(max_length=1000, help_text="An absolute folder on the server with config.json, "
                                                            "*.safetensors weights and a tokenizer file.")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class ModelUploadSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST models/upload/`` (multipart): a Hugging Face model folder's files, flat, by name."""

    name = serializers.CharField(max_length=100, help_text="What job specs call it (spec.model), unique among "
                                                           "the organization's and the published models.")
    files = serializers.ListField(child=serializers.FileField(allow_empty_file=False), allow_empty=False,
                                  help_text="config.json, the *.safetensors weights and the tokenizer files, one "
                                            "part each (no pickle .bin/.pt, no code).")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class ModelEntrySerializer(serializers.Serializer):
    """A model a job may name: a built-in preset, a published folder or one of the organization's uploads."""

    id = serializers.IntegerField(allow_null=True, help_text="null for a preset.")
    name = serializers.CharField()
    builtin = serializers.BooleanField(help_text="An engine preset, built on first use.")
    scope = serializers.ChoiceField(choices=("builtin", "published", "organization"),
                                    help_text="builtin, published to every organization, or the organization's own.")
    path = serializers.CharField(allow_null=True, help_text="The folder on the server; null for a preset.")
    description = serializers.CharField(allow_blank=True)
    architecture = serializers.CharField(allow_null=True, help_text="config.json's architecture (null: a folder "
                                                                    "staff registered unchecked).")
    parameters = serializers.IntegerField(allow_null=True)
    size_bytes = serializers.IntegerField(allow_null=True)
    dtype = serializers.CharField(allow_null=True, help_text="The stored weights' dtype (float32, bfloat16, ...).")
    created_at = serializers.DateTimeField(allow_null=True, help_text="When it was registered; null for a preset.")


# --- cluster --------------------------------------------------------------------------------------


class ClusterJobSerializer(serializers.Serializer):
    """An active job; another organization's is anonymised for all but platform staff (job, name,
    organization and created_at are null)."""

    job = serializers.IntegerField(allow_null=True)
    name = serializers.CharField(allow_null=True, allow_blank=True)
    organization = serializers.CharField(allow_null=True)
    state = serializers.ChoiceField(choices=JobState.choices)
    created_at = serializers.DateTimeField(allow_null=True)
    reserved_devices = serializers.IntegerField()
    own = serializers.BooleanField(help_text="A job of the request's organization.")


class ClusterQuerySerializer(serializers.Serializer):
    """``GET cluster/`` query parameters."""

    window = serializers.IntegerField(min_value=1, max_value=TIMELINE_MAX_WINDOW_S, default=TIMELINE_WINDOW_S,
                                      help_text="Seconds of device timeline to return, ending now.")


class ClusterIntervalSerializer(serializers.Serializer):
    """One call's device interval on a WPG (the cluster socket's ``usage`` message, plus ``seq``);
    another organization's is anonymised for all but platform staff (job, name, organization null)."""

    seq = serializers.IntegerField(help_text="The usage entry's id: the cluster socket's ?last_seq=.")
    wpg = serializers.CharField()
    job = serializers.IntegerField(allow_null=True)
    name = serializers.CharField(allow_null=True, allow_blank=True)
    organization = serializers.CharField(allow_null=True)
    own = serializers.BooleanField(help_text="A call of the request's organization.")
    fn = serializers.CharField()
    role = serializers.CharField()
    devices = serializers.FloatField()
    start = serializers.FloatField(help_text="Unix seconds.")
    end = serializers.FloatField(help_text="Unix seconds.")


class ClusterTimelineSerializer(serializers.Serializer):
    """The calls that ended in [since, until], by start."""

    since = serializers.FloatField(help_text="Unix seconds.")
    until = serializers.FloatField(help_text="Unix seconds (now).")
    intervals = ClusterIntervalSerializer(many=True)
    truncated = serializers.BooleanField(help_text="More calls ended in the window; only the newest are listed.")


class ClusterUtilisationSerializer(serializers.Serializer):
    """How busy one WPG was over the timeline's window."""

    wpg = serializers.CharField()
    devices = serializers.FloatField(help_text="The most devices any of its calls held.")
    busy_fraction = serializers.FloatField(help_text="Share of the window in which a call ran on it (0..1).")


class ClusterSerializer(serializers.Serializer):
    """Every active job of the cluster, in queue order, and their totals; the device timeline of
    the last ``window`` seconds and each WPG's utilisation over it."""

    jobs = ClusterJobSerializer(many=True)
    active_jobs = serializers.IntegerField()
    reserved_devices = serializers.IntegerField()
    timeline = ClusterTimelineSerializer()
    utilisation = ClusterUtilisationSerializer(many=True)
