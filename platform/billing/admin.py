"""Django admin for the usage ledger (platform staff), read-only: rows come only from the jobs'
event logs, keyed by (job, seq)."""

from django.contrib import admin

from accounts.admin import ReadOnlyAdminMixin
from billing.models import CapacitySample, UsageEntry


@admin.register(UsageEntry)
class UsageEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("job", "seq", "organization", "role", "fn", "wpg", "devices", "device_seconds", "start", "end")
    list_filter = ("organization", "role", "fn")
    search_fields = ("wpg", "job__name")
    list_select_related = ("job", "organization")


@admin.register(CapacitySample)
class CapacitySampleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("at", "devices")
    date_hierarchy = "at"
