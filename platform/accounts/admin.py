"""Django admin for the accounts models (platform staff).

Users are editable (passwords, staff flags). Plans are created and edited here, and an
organization's plan is assigned here, both through ``accounts.services`` (audited with the staff
member, effective at once). Everything else -- organizations' other fields, memberships, tokens,
the audit log -- is read-only here: those changes go through the services from the API and the
management commands, which check the owner rules and write the audit row in the same transaction.
"""

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts import services
from accounts.models import ApiToken, AuditLog, Membership, Organization, Plan, User


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
class OrganizationAdmin(admin.ModelAdmin):
    """Browse organizations; the plan is the one field staff change here (``services.plan_assign``)."""

    list_display = ("name", "slug", "plan", "created_at")
    list_filter = ("plan",)
    search_fields = ("name", "slug")
    fields = ("name", "slug", "plan", "created_at")
    readonly_fields = ("name", "slug", "created_at")
    inlines = (MembershipInline,)

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # organizations are created with their first owner: the API or the command

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        services.plan_assign(organization=obj, plan=form.cleaned_data["plan"], actor=request.user)


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Create and edit plans through ``services.plan_create`` / ``plan_update`` (audited)."""

    list_display = ("name", *Plan.LIMIT_FIELDS, "weight", "max_priority", "updated_at")
    fields = ("name", *Plan.EDITABLE_FIELDS)

    def get_readonly_fields(self, request, obj=None):
        return ("name",) if obj else ()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # organizations keep their plan; retire one by moving them off it

    def save_model(self, request, obj, form, change) -> None:
        values = {name: form.cleaned_data[name] for name in Plan.EDITABLE_FIELDS if name in form.cleaned_data}
        if change:
            services.plan_update(plan=Plan.objects.get(pk=obj.pk), actor=request.user, **values)
        else:
            created = services.plan_create(actor=request.user, name=obj.name, **values)
            obj.pk = created.pk


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


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("created_at", "organization", "actor", "action", "target")
    list_filter = ("action", "organization")
    search_fields = ("action", "target")
