"""Account models: users, organizations (the tenants), memberships with roles, API tokens, quotas
and the audit log.

Writes go through ``accounts.services`` and reads through ``accounts.selectors``; both take the
organization first, so no query here runs without its tenant.
"""

import hashlib
import secrets

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

# What a plaintext token starts with: recognisable in logs and by secret scanners.
TOKEN_PREFIX = "plx_"  # noqa: S105 - a public marker, not a secret
# How much of the plaintext a token list shows: "plx_" and 8 random characters.
TOKEN_DISPLAY_CHARS = len(TOKEN_PREFIX) + 8
# The longest lifetime a token may be given (ten years); none at all means it never expires.
TOKEN_MAX_DAYS = 3650


class User(AbstractUser):
    """The project's own user model, in place before the first migration so it can grow later
    (Django cannot swap ``AUTH_USER_MODEL`` once tables exist). ``is_staff`` marks platform staff,
    who create organizations and (later) see cluster-wide views."""


class Organization(models.Model):
    """A tenant: every job, token, quota and audit row belongs to exactly one."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
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


class Quota(models.Model):
    """An organization's limits; a null limit means unlimited."""

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="quota")
    device_hours_per_month = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(0)]
    )
    max_concurrent_jobs = models.PositiveIntegerField(null=True, blank=True)
    max_devices_per_job = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The limits quota_set may change, in display order.
    LIMIT_FIELDS = ("device_hours_per_month", "max_concurrent_jobs", "max_devices_per_job")

    def __str__(self) -> str:
        limits = ", ".join(
            f"{name}={'unlimited' if getattr(self, name) is None else getattr(self, name)}"
            for name in self.LIMIT_FIELDS
        )
        return f"Quota of {self.organization}: {limits}"


class AuditLog(models.Model):
    """Who changed what in an organization, written in the same transaction as the change.

    ``action`` is ``<noun>.<verb>``: organization.created, member.added, member.removed,
    member.role_changed, token.created, token.revoked, quota.changed (the jobs app adds job.*).
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="audit_log")
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
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.organization}: {self.action} {self.target}"
