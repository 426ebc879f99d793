"""What jobs run on, and where, under ``/api/v1/`` (routes in ``jobs.urls``):

- ``datasets/``: the organization's own problems (JSONL uploads); viewers read, members upload and
  delete their own, admins and owners anyone's. Another organization's dataset answers 404.
- ``models/``: the models a job may name (the engine's presets, the folders published to every
  organization, the organization's own uploads); anyone in an organization reads, members upload
  and delete their own, admins and owners any of the organization's, platform staff register and
  publish. Another organization's model answers 404.
- ``cluster/``: every active job of the cluster, other organizations' anonymised except for staff.
"""

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.api import HasOrgRole, OrgAPIView, OrgGenericAPIView, StaffAPIView, require_role, role_map
from accounts.models import Role
from jobs import catalog, cluster, datasets, model_uploads
from jobs.models import Dataset, RegisteredModel
from jobs.resource_serializers import (
    ClusterQuerySerializer,
    ClusterSerializer,
    DatasetSerializer,
    DatasetUploadSerializer,
    ModelEntrySerializer,
    ModelRegisterSerializer,
    ModelUploadSerializer,
)
from jobs.serializers import ConflictSerializer
from jobs.views import Conflict

# Multipart framing around the file: a request longer than the limit plus this is refused unread.
MULTIPART_SLACK = 64 * 1024


def _refuse_longer_than(request: Request, limit: int, field: str, message) -> None:
    """A 400 on ``field`` (``message(length, limit)``) for an upload whose declared length passes
    ``limit`` and its multipart framing, before its body is read."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > limit + MULTIPART_SLACK:
        raise exceptions.ValidationError({field: [message(length, limit)]})


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
        _refuse_longer_than(request, datasets.size_limit(request.organization), "file", datasets.too_big_message)
        serializer = DatasetUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        body = serializer.validated_data
        dataset = datasets.dataset_create(organization=request.organization, user=request.user, name=body["name"],
                                          upload=body["file"], fmt=body.get("format"),
                                          columns=(body["prompt_column"], body["answer_column"]),
                                          eval_upload=body.get("eval_file"))
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
    """``GET models/``: the models a job's ``spec.model`` may name, built-in presets first, then the
    published ones and the organization's own by name. ``POST`` (platform staff): publish a local
    Hugging Face model folder on the server by name."""

    organization_required = False  # staff need no organization; StaffOrOrgMember checks the others
    permission_classes = (IsAuthenticated, HasOrgRole, StaffOrOrgMember, StaffWrites)

    @extend_schema(summary="List models", responses=ModelEntrySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(ModelEntrySerializer(catalog.models_catalog(organization=request.organization), many=True).data)

    @extend_schema(summary="Register a model", request=ModelRegisterSerializer, responses={201: ModelEntrySerializer})
    def post(self, request: Request) -> Response:
        serializer = ModelRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        model = catalog.model_register(user=request.user, **serializer.validated_data)
        return Response(ModelEntrySerializer(catalog.model_entry(model)).data, status=status.HTTP_201_CREATED)


class ModelUploadView(OrgAPIView):
    """``POST models/upload/`` (members; multipart ``name``, ``files``, optional ``description``):
    upload a Hugging Face model folder as one of the organization's models, checked before it is
    kept (safetensors only, an architecture the engine runs, every tensor's shape, the plan's
    size); any error stores nothing."""

    required_roles = role_map(POST=Role.MEMBER)
    parser_classes = (MultiPartParser,)

    @extend_schema(summary="Upload a model", request={"multipart/form-data": ModelUploadSerializer},
                   responses={201: ModelEntrySerializer})
    def post(self, request: Request) -> Response:
        _refuse_longer_than(request, request.organization.plan.max_model_bytes, "files", model_uploads.too_big_message)
        serializer = ModelUploadSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        body = serializer.validated_data
        model = model_uploads.model_upload(organization=request.organization, user=request.user, name=body["name"],
                                           files=body["files"], description=body["description"])
        return Response(ModelEntrySerializer(catalog.model_entry(model)).data, status=status.HTTP_201_CREATED)


class ModelDetailView(OrgAPIView):
    """``GET models/{id}/``: a published model or one of the organization's (another organization's
    answers 404). ``DELETE``: members delete their organization's models they uploaded, admins and
    owners any of its models, platform staff published ones; 409 while an active job trains it."""

    organization_required = False
    permission_classes = (IsAuthenticated, HasOrgRole, StaffOrOrgMember)

    def get_object(self) -> RegisteredModel:
        return catalog.model_get(organization=self.request.organization, pk=self.kwargs["model_id"])

    @extend_schema(summary="Show a model", responses=ModelEntrySerializer)
    def get(self, request: Request, model_id: int) -> Response:
        return Response(ModelEntrySerializer(catalog.model_entry(self.get_object())).data)

    @extend_schema(
        summary="Delete a model",
        responses={204: None, 409: OpenApiResponse(ConflictSerializer, description="An active job trains it.")},
    )
    def delete(self, request: Request, model_id: int) -> Response:
        model = self.get_object()
        if model.organization_id is None:
            if not request.user.is_staff:
                raise exceptions.PermissionDenied("Only platform staff can delete a published model.")
        else:
            require_role(request, Role.MEMBER if model.registered_by_id == request.user.pk else Role.ADMIN)
        try:
            model_uploads.model_delete(model=model, actor=request.user)
        except model_uploads.ModelInUse as exc:
            raise Conflict(str(exc)) from None
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelPublishView(StaffAPIView):
    """``POST models/{id}/publish/`` (platform staff): an organization's uploaded model becomes one
    every organization sees and may train."""

    @extend_schema(summary="Publish a model to every organization", request=None, responses=ModelEntrySerializer)
    def post(self, request: Request, model_id: int) -> Response:
        model = get_object_or_404(RegisteredModel, pk=model_id)
        model = model_uploads.model_publish(model=model, actor=request.user)
        return Response(ModelEntrySerializer(catalog.model_entry(model)).data)


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
