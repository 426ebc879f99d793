"""What jobs run on, and where, under ``/api/v1/`` (routes in ``jobs.urls``):

- ``datasets/``: the organization's own problems (JSONL uploads); viewers read, members upload and
  delete their own, admins and owners anyone's. Another organization's dataset answers 404.
- ``models/``: the models a job may name (the engine's presets and the folders staff registered);
  anyone in an organization reads, platform staff register.
- ``cluster/``: every active job of the cluster, other organizations' anonymised except for staff.
"""

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api import HasOrgRole, OrgAPIView, OrgGenericAPIView, require_role, role_map
from accounts.models import Role
from jobs import catalog, cluster, datasets
from jobs.models import Dataset
from jobs.resource_serializers import (
    ClusterQuerySerializer,
    ClusterSerializer,
    DatasetSerializer,
    DatasetUploadSerializer,
    ModelEntrySerializer,
    ModelRegisterSerializer,
)
from jobs.serializers import ConflictSerializer
from jobs.views import Conflict

# Multipart framing around the file: a request longer than the limit plus this is refused unread.
MULTIPART_SLACK = 64 * 1024


class StaffOrOrgMember(BasePermission):
    """Platform staff, or anyone in the request's organization (any role)."""

    message = "You are not a member of any organization."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user.is_staff or getattr(request, "membership", None) is not None)


class StaffWrites(BasePermission):
    """Reads for all the other permissions let in; writes for platform staff only."""

    message = "Only platform staff can do this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return request.method in SAFE_METHODS or bool(request.user.is_staff)


# --- datasets -------------------------------------------------------------------------------------


class DatasetListCreateView(OrgGenericAPIView):
    """``GET datasets/``: the organization's datasets, newest first. ``POST`` (members, multipart
    ``name`` and ``file``, optionally ``format``, ``prompt_column`` and ``answer_column``): upload
    a file of problems (JSONL, CSV, Parquet), validated line by line (row by row) before it is
    stored; any error creates nothing."""

    required_roles = role_map(GET=Role.VIEWER, POST=Role.MEMBER)
    serializer_class = DatasetSerializer
    parser_classes = (MultiPartParser, FormParser)

    def get_queryset(self) -> QuerySet[Dataset]:
        return datasets.datasets_of(organization=self.request.organization)

    @extend_schema(summary="List datasets", responses=DatasetSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(DatasetSerializer(page, many=True).data)

    @extend_schema(summary="Upload a dataset", request=DatasetUploadSerializer, responses={201: DatasetSerializer})
    def post(self, request: Request) -> Response:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > datasets.MAX_BYTES + MULTIPART_SLACK:  # refused before the body is read
            raise exceptions.ValidationError({"file": [datasets.too_big_message(length)]})
        serializer = DatasetUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        body = serializer.validated_data
        dataset = datasets.dataset_create(organization=request.organization, user=request.user, name=body["name"],
                                          upload=body["file"], fmt=body.get("format"),
                                          columns=(body["prompt_column"], body["answer_column"]))
        dataset = datasets.dataset_get(organization=request.organization, pk=dataset.pk)
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetDetailView(OrgGenericAPIView):
    """``GET datasets/{id}/``: one dataset. ``DELETE``: members delete their own, admins and owners
    anyone's; 409 while an active job reads it."""

    required_roles = role_map(GET=Role.VIEWER, DELETE=Role.MEMBER)
    serializer_class = DatasetSerializer

    def get_object(self) -> Dataset:
        return datasets.dataset_get(organization=self.request.organization, pk=self.kwargs["dataset_id"])

    @extend_schema(summary="Show a dataset")
    def get(self, request: Request, dataset_id: int) -> Response:
        return Response(DatasetSerializer(self.get_object()).data)

    @extend_schema(
        summary="Delete a dataset",
        responses={
            204: None,
            409: OpenApiResponse(ConflictSerializer, description="An active job reads the dataset."),
        },
    )
    def delete(self, request: Request, dataset_id: int) -> Response:
        dataset = self.get_object()
        if dataset.created_by_id != request.user.pk:
            require_role(request, Role.ADMIN)
        try:
            datasets.dataset_delete(dataset=dataset, actor=request.user)
        except datasets.DatasetInUse as exc:
            raise Conflict(str(exc)) from None
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- models ---------------------------------------------------------------------------------------


class ModelListCreateView(OrgAPIView):
    """``GET models/``: the models a job's ``spec.model`` may name, built-in presets first.
    ``POST`` (platform staff): register a local Hugging Face model folder by name."""

    organization_required = False  # staff need no organization; StaffOrOrgMember checks the others
    permission_classes = (IsAuthenticated, HasOrgRole, StaffOrOrgMember, StaffWrites)

    @extend_schema(summary="List models", responses=ModelEntrySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ModelEntrySerializer(catalog.models_catalog(), many=True).data)

    @extend_schema(summary="Register a model", request=ModelRegisterSerializer, responses={201: ModelEntrySerializer})
    def post(self, request: Request) -> Response:
        serializer = ModelRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        model = catalog.model_register(user=request.user, **serializer.validated_data)
        entry = {"name": model.name, "builtin": False, "path": model.path, "description": model.description,
                 "created_at": model.created_at}
        return Response(ModelEntrySerializer(entry).data, status=status.HTTP_201_CREATED)


# --- cluster --------------------------------------------------------------------------------------


class ClusterView(OrgAPIView):
    """``GET cluster/?window=600``: every active job of the cluster in queue order, with the devices
    each reserves; the device timeline of the last ``window`` seconds (1..86400) and each WPG's
    utilisation over it. Staff see everything in full; others see their organization's in full
    and the rest anonymised. Read from the database; the engine is not asked. The live
    continuation of the timeline is the ``/ws/cluster/?last_seq=`` socket (``jobs.consumers``)."""

    organization_required = False
    permission_classes = (IsAuthenticated, HasOrgRole, StaffOrOrgMember)

    @extend_schema(summary="Show the cluster's active jobs and device timeline", parameters=[ClusterQuerySerializer],
                   responses=ClusterSerializer)
    def get(self, request: Request) -> Response:
        query = ClusterQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        view = cluster.cluster_view(user=request.user, organization=request.organization,
                                    window=query.validated_data["window"])
        return Response(ClusterSerializer(view).data)
