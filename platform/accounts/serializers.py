"""Input and output shapes of the accounts API (``accounts.views``).

Input serializers only validate (services do the writes) and reject unknown fields
(``StrictFieldsMixin``); output serializers never include a token's plaintext or digest, except
``TokenCreatedSerializer``, which shows the plaintext the one time it exists.
"""

from typing import Any

from django.contrib.auth import authenticate
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts import selectors
from accounts.api import ModelSerializer, StrictFieldsMixin
from accounts.models import (
    MAX_DATASET_BYTES,
    TOKEN_MAX_DAYS,
    ApiToken,
    AuditLog,
    Membership,
    Organization,
    Plan,
    Priority,
    Role,
    User,
)


def _username_field(**kwargs) -> serializers.SlugRelatedField:
    """A username that must exist; validates to the ``User``."""
    return serializers.SlugRelatedField(
        slug_field="username",
        queryset=User.objects.all(),
        error_messages={"does_not_exist": "No user named {value!r}.", "invalid": "Give a username (a string)."},
        **kwargs,
    )


# --- tokens -------------------------------------------------------------------------------------


class TokenCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST tokens/``: a new token of the requesting user in the current organization."""

    name = serializers.CharField(max_length=100, default="api")
    expires_days = serializers.IntegerField(
        min_value=1, max_value=TOKEN_MAX_DAYS, required=False, allow_null=True, help_text="None: never expires."
    )


class ObtainTokenSerializer(TokenCreateSerializer):
    """``POST auth/token/``: credentials, and the organization when the user has several."""

    username = serializers.CharField(max_length=150)
    password = serializers.CharField(
        max_length=4096, write_only=True, trim_whitespace=False, style={"input_type": "password"}
    )
    organization = serializers.CharField(
        max_length=100, required=False, help_text="Id or slug; needed when the user belongs to several."
    )

    def validate(self, attrs):
        request = self.context.get("request")
        user = authenticate(request, username=attrs["username"], password=attrs["password"])
        if user is None:
            raise serializers.ValidationError("Unable to log in with the given username and password.")
        organizations = selectors.organizations_of(user=user)
        wanted = attrs.get("organization")
        if wanted:
            organization = None
            if wanted.isdigit() and int(wanted) < 2**63:
                organization = organizations.filter(pk=int(wanted)).first()
            organization = organization or organizations.filter(slug=wanted).first()
            if organization is None:
                raise serializers.ValidationError({"organization": f"You are not a member of {wanted!r}."})
        else:
            count = organizations.count()
            if count == 0:
                raise serializers.ValidationError({"organization": "You are not a member of any organization."})
            if count > 1:
                raise serializers.ValidationError(
                    {"organization": "You belong to several organizations; give one (its id or slug)."}
                )
            organization = organizations.first()
        attrs["user"] = user
        attrs["organization"] = organization
        return attrs


class TokenSerializer(ModelSerializer):
    """A token in lists: never its plaintext or digest."""

    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ApiToken
        fields = (
            "id",
            "name",
            "prefix",
            "user",
            "organization",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        )
        read_only_fields = fields


class TokenCreatedSerializer(TokenSerializer):
    """A token just created, with its plaintext: shown this once, stored nowhere."""

    token = serializers.SerializerMethodField(help_text="The token itself; it cannot be shown again.")

    class Meta(TokenSerializer.Meta):
        fields = (*TokenSerializer.Meta.fields, "token")
        read_only_fields = fields

    def get_token(self, obj: ApiToken) -> str:
        return self.context["plaintext"]


class WebsocketTicketSerializer(serializers.Serializer):
    """``POST ws-ticket/``: a ticket for one websocket connection (``?ticket=``)."""

    ticket = serializers.CharField(help_text="Pass as ?ticket= when opening /ws/...; bound to you and "
                                             "the organization you act in.")
    expires_in = serializers.IntegerField(help_text="Seconds the ticket stays valid for opening a connection.")


# --- organizations and members --------------------------------------------------------------------


class OrganizationSerializer(ModelSerializer):
    """An organization as one of yours: with your role and whether it is the current one."""

    role = serializers.ChoiceField(choices=Role.choices, read_only=True, allow_null=True)
    current = serializers.SerializerMethodField()

    class Meta:
        model = Organization
        fields = ("id", "name", "slug", "created_at", "role", "current")
        read_only_fields = fields

    def get_current(self, obj: Organization) -> bool:
        current = self.context.get("current")
        return current is not None and current.pk == obj.pk


class OrganizationCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST organizations/`` (platform staff): a new organization and its first owner."""

    name = serializers.CharField(max_length=100)
    slug = serializers.SlugField(max_length=100, required=False, help_text="Default: made from the name.")
    owner = _username_field(help_text="Username of the first owner.")


class MemberSerializer(ModelSerializer):
    """A member of the current organization."""

    user_id = serializers.IntegerField(source="user.pk", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    email = serializers.EmailField(source="user.email", read_only=True)

    class Meta:
        model = Membership
        fields = ("user_id", "username", "email", "role", "created_at")
        read_only_fields = fields


class MemberAddSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST organizations/{id}/members/``."""

    username = _username_field()
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MemberRoleSerializer(StrictFieldsMixin, serializers.Serializer):
    """``PATCH organizations/{id}/members/{user_id}/``."""

    role = serializers.ChoiceField(choices=Role.choices)


# --- plans, quota and audit ---------------------------------------------------------------------

_HOURS = {"max_digits": 12, "decimal_places": 2, "min_value": 0, "allow_null": True, "coerce_to_string": False}
_COUNT = {"min_value": 1, "max_value": 2**31 - 1, "allow_null": True}


class PlanInputSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST plans/`` (``name`` required) and ``PATCH plans/{id}/`` (any field but the name);
    null limits mean unlimited."""

    name = serializers.SlugField(max_length=50)
    description = serializers.CharField(max_length=200, allow_blank=True, required=False)
    device_hours_per_month = serializers.DecimalField(required=False, **_HOURS)
    max_concurrent_jobs = serializers.IntegerField(required=False, **_COUNT)
    max_devices_per_job = serializers.IntegerField(required=False, **_COUNT)
    weight = serializers.FloatField(min_value=0.01, max_value=1000, required=False)
    max_priority = serializers.ChoiceField(choices=Priority.choices, required=False)
    max_model_bytes = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False)
    max_dataset_bytes = serializers.IntegerField(min_value=1, max_value=MAX_DATASET_BYTES, required=False)

    def __init__(self, *args: Any, partial_update: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if partial_update:  # a plan keeps its name: it is how staff and the audit log refer to it
            del self.fields["name"]


class PlanSerializer(ModelSerializer):
    """A plan as platform staff see it, with how many organizations are on it."""

    device_hours_per_month = serializers.DecimalField(read_only=True, **_HOURS)
    organization_count = serializers.IntegerField(read_only=True, default=None)

    class Meta:
        model = Plan
        fields = ("id", "name", "description", *Plan.LIMIT_FIELDS, "weight", "max_priority", *Plan.UPLOAD_FIELDS,
                  "organization_count", "created_at", "updated_at")
        read_only_fields = fields


class PlanAssignSerializer(StrictFieldsMixin, serializers.Serializer):
    """``PUT organizations/{id}/plan/``: the plan's name."""

    plan = serializers.SlugRelatedField(slug_field="name", queryset=Plan.objects.all())


class OrganizationPlanSerializer(serializers.Serializer):
    """An organization and the plan it is on (what ``PUT organizations/{id}/plan/`` answers)."""

    organization = serializers.IntegerField(source="pk", read_only=True)
    slug = serializers.CharField(read_only=True)
    plan = PlanSerializer(read_only=True)


class QuotaUsageSerializer(serializers.Serializer):
    """Use against the quota."""

    device_hours_this_month = serializers.DecimalField(read_only=True, **_HOURS)
    over_budget_device_hours = serializers.DecimalField(
        read_only=True, help_text="This month's use past device_hours_per_month (null: no budget).",
        **_HOURS)
    concurrent_jobs = serializers.IntegerField(read_only=True, help_text="Jobs holding a slot (not ended).")
    queued_jobs = serializers.IntegerField(read_only=True, help_text="Jobs waiting queued for a slot.")


class QuotaSerializer(ModelSerializer):
    """The current organization's plan: its limits (null: unlimited), its scheduler weight, the
    highest priority its jobs may ask for, and its use. Set by platform staff only."""

    plan = serializers.CharField(source="name", read_only=True)
    organization = serializers.SerializerMethodField()
    device_hours_per_month = serializers.DecimalField(read_only=True, **_HOURS)
    usage = serializers.SerializerMethodField()

    class Meta:
        model = Plan
        fields = ("organization", "plan", *Plan.LIMIT_FIELDS, "weight", "max_priority", *Plan.UPLOAD_FIELDS,
                  "updated_at", "usage")
        read_only_fields = fields

    def get_organization(self, obj: Plan) -> int:
        return self.context["organization"].pk

    @extend_schema_field(QuotaUsageSerializer)
    def get_usage(self, obj: Plan) -> dict:
        return QuotaUsageSerializer(self.context["usage"]).data


class AuditLogSerializer(ModelSerializer):
    """One audit row; ``actor`` is null for the system."""

    actor = serializers.CharField(source="actor.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = AuditLog
        fields = ("id", "created_at", "actor", "action", "target", "data")
        read_only_fields = fields
