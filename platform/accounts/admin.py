"""Django admin for the accounts models (platform staff).

Users are editable (passwords, staff flags). Organizations, memberships, tokens, quotas and the
audit log are read-only here: their changes go through ``accounts.services`` (the API and the
management commands), which check the owner rules and write the audit row in the same transaction.
"""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import ApiToken, AuditLog, Membership, Organization, Quota, User


class ReadOnlyAdminMixin:
    """Browse, never add, change or delete: an admin edit would skip the services' rules and audit."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class MembershipInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = fields


@admin.register(User)
class PlexUserAdmin(UserAdmin):
    pass


@admin.register(Organization)
class OrganizationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "slug", "created_at")
    search_fields = ("name", "slug")
    inlines = (MembershipInline,)


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("user", "organization", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("user__username", "organization__name")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "prefix", "user", "organization", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("organization",)
    search_fields = ("name", "prefix", "user__username")
    exclude = ("digest",)


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "organization",
        "device_hours_per_month",
        "max_concurrent_jobs",
        "max_devices_per_job",
        "updated_at",
    )


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "organization", "actor", "action", "target")
    list_filter = ("action", "organization")
    search_fields = ("action", "target")
