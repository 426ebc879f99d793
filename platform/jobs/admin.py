"""Django admin for jobs, their metrics and events (platform staff), read-only: a job changes
through ``jobs.services`` (state rules, audit rows, the engine) and its log through ingestion."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from accounts.admin import ReadOnlyAdminMixin
from jobs import catalog
from jobs.models import Dataset, Job, JobEvent, JobMetric, RegisteredModel


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


@admin.register(Dataset)
class DatasetAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "name", "organization", "problems", "size_bytes", "created_by", "created_at")
    list_filter = ("organization",)
    search_fields = ("name", "organization__name")
    list_select_related = ("organization", "created_by")


class RegisteredModelForm(forms.ModelForm):
    """The REST endpoint's checks: a free name and a loadable Hugging Face folder."""

    class Meta:
        model = RegisteredModel
        fields = ("name", "path", "description")

    def clean(self):
        data = super().clean()
        if self.instance.pk is None and not self.errors:
            try:
                data["name"], folder = catalog.clean_registration(name=data.get("name", ""), path=data.get("path", ""))
            except ValidationError as exc:
                raise ValidationError(exc.message_dict) from None
            data["path"] = str(folder)
        return data


@admin.register(RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin):
    """Staff register a model folder here or through ``POST models/``; once registered only its
    description changes (jobs already created keep the path they resolved)."""

    form = RegisteredModelForm
    list_display = ("name", "path", "registered_by", "created_at")
    search_fields = ("name", "path", "description")

    def get_readonly_fields(self, request, obj=None):
        return ("name", "path", "registered_by", "created_at") if obj else ("registered_by", "created_at")

    def save_model(self, request, obj, form, change):
        if not change:
            obj.registered_by = request.user
        super().save_model(request, obj, form, change)
