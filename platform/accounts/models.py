"""Account models: users, organizations (the tenants), memberships with roles, API tokens, the
plans platform staff assign (an organization's quota and its scheduler weight) and the audit log.

Writes go through ``accounts.services`` and reads through ``accounts.selectors``; both take the
organization first, so no query here runs without its tenant.
"""

import hashlib
import secrets

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from engine.control import MAX_DATASET_BYTES

# What a plaintext token starts with: recognisable in logs and by secret scanners.
TOKEN_PREFIX = "plx_"  # noqa: S105 - a public marker, not a secret
# How much of the plaintext a token list shows: "plx_" and 8 random characters.
TOKEN_DISPLAY_CHARS = len(TOKEN_PREFIX) + 8
# The longest lifetime a token may be given (ten years); none at all means it never expires.
TOKEN_MAX_DAYS = 3650
DEFAULT_MAX_MODEL_BYTES = 4 * 1024**3  # a plan's largest model upload unless staff set another


class User(AbstractUser):
    """The project's own user model, in place before the first migration so it can grow later
    (Django cannot swap ``AUTH_USER_MODEL`` once tables exist). ``is_staff`` marks platform staff,
    who create organizations and (later) see cluster-wide views."""


class Priority(models.TextChoices):
    """A job's priority within its organization's share of the devices, chosen at submission up to
    what the plan allows. The engine multiplies the tenant's weight by its factor
    (``engine.spec.PRIORITIES``)."""

    LOW = "low", "Low"
    NORMAL = "normal", "Normal"
    HIGH = "high", "High"

    @property
    def rank(self) -> int:
        return list(Priority).index(self)


class Plan(models.Model):
    """What an organization may use, set by platform staff only: its quota (null: unlimited) and its
    weight in the scheduler's fair share. Every organization is on exactly one plan; new ones get
    the default plan (``settings.PLEXRL_DEFAULT_PLAN``)."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.CharField(max_length=200, blank=True)
    device_hours_per_month = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="Device-hours its jobs may use per calendar month (empty: unlimited).",
    )
    max_concurrent_jobs = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Jobs running at once; more wait queued (empty: unlimited).",
    )
    max_devices_per_job = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Devices one job may reserve (empty: unlimited).",
    )
    weight = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01)],
        help_text="The organization's share of contended devices, relative to other organizations' weights.",
    )
    max_priority = models.CharField(
        max_length=8, choices=Priority.choices, default=Priority.NORMAL,
        help_text="The highest priority its jobs may ask for.",
    )
    max_model_bytes = models.PositiveBigIntegerField(
        default=DEFAULT_MAX_MODEL_BYTES, validators=[MinValueValidator(1)],
        help_text="The largest model folder its members may upload (bytes).",
    )
    max_dataset_bytes = models.PositiveBigIntegerField(
        default=MAX_DATASET_BYTES, validators=[MinValueValidator(1), MaxValueValidator(MAX_DATASET_BYTES)],
        help_text=f"The largest dataset file its members may upload (bytes; at most the engine's {MAX_DATASET_BYTES}).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The limits, in display order; then the fields staff may change.
    LIMIT_FIELDS = ("device_hours_per_month", "max_concurrent_jobs", "max_devices_per_job")
    UPLOAD_FIELDS = ("max_model_bytes", "max_dataset_bytes")
    EDITABLE_FIELDS = ("description", *LIMIT_FIELDS, "weight", "max_priority", *UPLOAD_FIELDS)

    class Meta:
        ordering = ("name",)
        constraints = (models.CheckConstraint(condition=models.Q(weight__gt=0), name="plan_weight_positive"),)

    def __str__(self) -> str:
        limits = ", ".join(
            f"{name}={'unlimited' if getattr(self, name) is None else getattr(self, name)}"
            for name in self.LIMIT_FIELDS
        )
        return f"Plan {self.name}: {limits}, weight={self.weight:g}, max_priority={self.max_priority}"

    @property
    def is_unlimited(self) -> bool:
        """Whether any limit is missing (such a plan may not be the default)."""
        return any(getattr(self, name) is None for name in self.LIMIT_FIELDS)

    def allows_priority(self, priority: str) -> bool:
        return Priority(priority).rank <= Priority(self.max_priority).rank


def default_plan() -> Plan:
    """The plan new organizations start on: ``settings.PLEXRL_DEFAULT_PLAN``. It must exist and
    limit everything (a platform never hands out unlimited use by default)."""
    from django.core.exceptions import ImproperlyConfigured

    name = settings.PLEXRL_DEFAULT_PLAN
    # only the columns read here: migration 0003 calls this for the Plan of its time, before later
    # migrations add columns the model has now
    plan = Plan.objects.filter(name=name).only("pk", "name", *Plan.LIMIT_FIELDS).first()
    if plan is None:
        raise ImproperlyConfigured(
            f"The default plan {name!r} (PLEXRL_DEFAULT_PLAN) does not exist; create it with "
            f"`manage.py plan create {name} ...` or name another one."
        )
    if plan.is_unlimited:
        raise ImproperlyConfigured(
            f"The default plan {name!r} leaves a limit unlimited; set every limit, or name another plan."
        )
    return plan


def default_plan_id() -> int:
    return default_plan().pk


class Organization(models.Model):
    """A tenant: every job, token and audit row belongs to exactly one; it is on one plan."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="organizations", default=default_plan_id,
                             help_text="Set by platform staff only.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    """A member's role, weakest first; each role can do everything the ones before it can.

    viewer: read only. member: create and act on the organization's jobs. admin: manage members
    (except owners) and the quota. owner: everything, including granting and removing owners.
    """

    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"
    OWNER = "owner", "Owner"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def at_least(self, minimum: "Role | str") -> bool:
        """Whether this role includes ``minimum``'s rights: ``Role.ADMIN.at_least("member")``."""
        return self.rank >= Role(minimum).rank


class Membership(models.Model):
    """A user's role in one organization; a user may belong to several organizations."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = (
            models.UniqueConstraint(fields=("user", "organization"), name="membership_unique_user_organization"),
        )
        ordering = ("organization_id", "id")

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"

    def has_role(self, minimum: Role | str) -> bool:
        """Whether this member has ``minimum``'s rights (a higher role counts)."""
        return Role(self.role).at_least(minimum)


def token_digest(plaintext: str) -> str:
    """The SHA-256 hex digest stored for a token.

    A fast hash is right here: tokens carry 256 random bits, so nothing can be guessed, and a slow
    password hash would cost every API request ~0.3 s.
    """
    return hashlib.sha256(plaintext.encode()).hexdigest()


def token_generate() -> str:
    """A new plaintext token: ``plx_`` and 43 URL-safe characters (32 random bytes)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class ApiToken(models.Model):
    """A bearer token of one user, valid in one organization while the user is a member there.

    Only the SHA-256 digest is stored; the plaintext is returned once, by ``services.token_create``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=TOKEN_DISPLAY_CHARS, help_text="The start of the token, shown in lists.")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 hex digest of the token.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=("organization", "user"), name="apitoken_org_user"),)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user} in {self.organization}"

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class AuditLog(models.Model):
    """Who changed what in an organization, written in the same transaction as the change.

    ``action`` is ``<noun>.<verb>``: organization.created, member.added, member.removed,
    member.role_changed, token.created, token.revoked, plan.assigned, plan.changed (the jobs app
    adds job.*, the notifications app webhook.created and webhook.deleted). Rows of no organization
    are the platform's own (plan.created, plan.changed).
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="audit_log",
                                     null=True, blank=True, help_text="Empty: a platform-wide change.")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Empty for the system (management commands, background tasks).",
    )
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=("organization", "-created_at"), name="auditlog_org_created"),)

    def __str__(self) -> str:
        where = self.organization or "platform"
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {where}: {self.action} {self.target}"
