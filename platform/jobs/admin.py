"""Django admin for jobs, their metrics and events (platform staff), read-only: a job changes
through ``jobs.services`` (state rules, audit rows, the engine) and its log through ingestion."""

from django.contrib import admin

from accounts.admin import ReadOnlyAdminMixin
from jobs.models import Job, JobEvent, JobMetric


@admin.register(Job)
class JobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "name", "organization", "state", "created_by", "created_at", "started_at", "finished_at")
    list_filter = ("state", "deployment_mode", "organization")
    search_fields = ("name", "organization__name", "created_by__username")
    list_select_related = ("organization", "created_by")


@admin.register(JobMetric)
class JobMetricAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("job", "step", "seq")
    list_filter = ("job__organization",)
    search_fields = ("job__name",)


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("job", "seq", "kind", "ts")
    list_filter = ("kind", "job__organization")
    search_fields = ("job__name", "kind")
