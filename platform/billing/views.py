"""The billing REST API under ``/api/v1/billing/`` (routes in ``billing.urls``): the usage ledger
and the savings report of the request's organization. Viewers can read both."""

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from accounts.api import OrgAPIView, OrgGenericAPIView, role_map
from accounts.models import Role
from billing import selectors
from billing.models import UsageEntry
from billing.renderers import CSVRenderer
from billing.serializers import (
    JobSavingsSerializer,
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
    csv_fields = tuple(JobSavingsSerializer().fields)

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
