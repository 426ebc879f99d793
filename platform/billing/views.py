"""The billing REST API under ``/api/v1/billing/`` (routes in ``billing.urls``): the usage ledger,
the savings report and the monthly summary of the request's organization (viewers can read them),
and the cluster's monthly report with its idle row (platform staff only)."""

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from accounts.api import OrgAPIView, OrgGenericAPIView, role_map
from accounts.models import Role
from billing import selectors
from billing.models import UsageEntry
from billing.renderers import CSVRenderer
from billing.serializers import (
    ClusterRowSerializer,
    ClusterSummarySerializer,
    JobMonthSerializer,
    JobSavingsSerializer,
    MonthlySummarySerializer,
    MonthQuerySerializer,
    SavingsReportSerializer,
    UsageEntrySerializer,
    UsageFilterSerializer,
)


class UsageListView(OrgGenericAPIView):
    """``GET billing/usage/``: the organization's usage ledger, by job and seq (``?job=<id>``)."""

    required_roles = role_map(GET=Role.VIEWER)
    serializer_class = UsageEntrySerializer

    def get_queryset(self) -> QuerySet[UsageEntry]:
        filters = UsageFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        return selectors.usage_of(organization=self.request.organization, **filters.validated_data)

    @extend_schema(summary="List usage", parameters=[UsageFilterSerializer], responses=UsageEntrySerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(UsageEntrySerializer(page, many=True).data)


class SavingsView(OrgAPIView):
    """``GET billing/savings/``: per job, billed device-hours against the dedicated counterfactual,
    and the totals. ``?format=csv`` (or ``Accept: text/csv``): the per-job rows as CSV."""

    required_roles = role_map(GET=Role.VIEWER)
    renderer_classes = (*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer)
    csv_fields = JobSavingsSerializer.CSV_FIELDS

    @extend_schema(
        summary="Show savings",
        parameters=[
            OpenApiParameter(
                "format", OpenApiTypes.STR, enum=["json", "csv"], description="csv: the per-job rows as CSV."
            )
        ],
        responses={(200, "application/json"): SavingsReportSerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> Response:
        report = SavingsReportSerializer(selectors.savings_of(organization=request.organization)).data
        if isinstance(request.accepted_renderer, CSVRenderer):
            return Response(report["jobs"])
        return Response(report)


def _month_of(request: Request):
    """The ``?month=YYYY-MM`` of the request (default: the current month); 400 on ``month`` if bad."""
    query = MonthQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data.get("month") or selectors.current_month()


_MONTH_PARAMETERS = [
    MonthQuerySerializer,
    OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"], description="csv: the rows as CSV."),
]


class MonthlySummaryView(OrgAPIView):
    """``GET billing/summary/?month=YYYY-MM``: the organization's device-hours in a calendar month
    (UTC; calls by start time), per job and in total. ``?format=csv``: the per-job rows."""

    required_roles = role_map(GET=Role.VIEWER)
    renderer_classes = (*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer)
    csv_fields = tuple(JobMonthSerializer().fields)

    @extend_schema(
        summary="Show the monthly summary",
        parameters=_MONTH_PARAMETERS,
        responses={(200, "application/json"): MonthlySummarySerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> Response:
        month = _month_of(request)
        summary = MonthlySummarySerializer(
            selectors.monthly_summary(organization=request.organization, month=month)).data
        if isinstance(request.accepted_renderer, CSVRenderer):
            return Response(summary["jobs"])
        return Response(summary)


class IsPlatformStaff(BasePermission):
    """Platform staff (``user.is_staff``), whatever their organizations."""

    message = "Only platform staff can see the cluster report."

    def has_permission(self, request: Request, view) -> bool:
        return bool(request.user and request.user.is_staff)


class ClusterSummaryView(OrgAPIView):
    """``GET billing/cluster/?month=YYYY-MM`` (platform staff; no organization needed): the cluster's
    capacity in the month, the device-hours billed to each organization (with its savings), and the
    idle device-hours nobody used. ``?format=csv``: a row per organization, a ``redone`` row when
    engine recoveries threw work away (used, not billed), then the ``idle`` row (and an
    ``over_capacity`` row when more was used than the capacity samples show)."""

    organization_required = False
    permission_classes = (IsAuthenticated, IsPlatformStaff)
    renderer_classes = (*api_settings.DEFAULT_RENDERER_CLASSES, CSVRenderer)
    csv_fields = tuple(ClusterRowSerializer().fields)

    @extend_schema(
        summary="Show the cluster's monthly report",
        parameters=_MONTH_PARAMETERS,
        responses={(200, "application/json"): ClusterSummarySerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> Response:
        report = ClusterSummarySerializer(selectors.cluster_summary(month=_month_of(request))).data
        if isinstance(request.accepted_renderer, CSVRenderer):
            rows = [{"kind": "organization", **org} for org in report["organizations"]]
            if report["redone_device_hours"] > 0:
                rows.append({"kind": "redone", "organization": None, "name": "redone",
                             "device_hours": report["redone_device_hours"]})
            rows.append({"kind": "idle", "organization": None, "name": "idle",
                         "device_hours": report["idle_device_hours"]})
            if report["over_capacity"]:
                rows.append({"kind": "over_capacity", "organization": None, "name": "over_capacity",
                             "device_hours": report["over_capacity_device_hours"]})
            return Response(ClusterRowSerializer(rows, many=True).data)
        return Response(report)
