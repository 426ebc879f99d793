"""The jobs REST API under ``/api/v1/`` (routes in ``jobs.urls``).

Thin views: each validates input with a serializer, calls one service (writes) or selector (reads)
and serializes the result. Jobs are fetched through ``selectors.job_get``, which starts from the
request's organization: another organization's job answers 404 on every endpoint.

Viewers read; members create jobs and act on their own; admins and owners act on anyone's.
A transition the job's state does not allow, or a quota it would exceed, answers 409.
"""

from collections.abc import Iterable

from django.db.models import QuerySet
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils.http import content_disposition_header
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, OpenApiTypes, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from accounts.api import EmptySerializer, OrgGenericAPIView, require_role, role_map
from accounts.models import Role
from jobs import selectors, services
from jobs.archives import file_stream, tensorboard_archive, zip_stream
from jobs.models import Job
from jobs.renderers import JSONLinesRenderer
from jobs.serializers import (
    ArtifactSerializer,
    ConflictSerializer,
    EstimateSerializer,
    EventFilterSerializer,
    JobCancelSerializer,
    JobCreateSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobFilterSerializer,
    JobMetricSerializer,
    JobSerializer,
)

CONFLICT = OpenApiResponse(ConflictSerializer, description="The job's state (or the quota) does not allow it.")


class Conflict(exceptions.APIException):
    """409 with ``{"detail": ...}`` and any further keys (``limit``)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, detail: str, **extra: str):
        super().__init__({"detail": detail, **extra})


def _detail(request: Request, job: Job, status_code: int = status.HTTP_200_OK) -> Response:
    """The job as ``GET jobs/{id}/`` shows it, read afresh (annotations included)."""
    job = selectors.job_get(organization=request.organization, pk=job.pk)
    return Response(JobDetailSerializer(job).data, status=status_code)


class JobListCreateView(OrgGenericAPIView):
    """``GET jobs/``: the organization's jobs, newest first (``?state=``, ``?search=``).
    ``POST``: create one (members); it is queued and launched once the transaction commits."""

    required_roles = role_map(GET=Role.VIEWER, POST=Role.MEMBER)
    serializer_class = JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        filters = JobFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        jobs = selectors.jobs_of(organization=self.request.organization, **filters.validated_data)
        return jobs.only(*JobSerializer.COLUMNS)  # not the spec and estimate (JSON to parse) of each job

    @extend_schema(summary="List jobs", parameters=[JobFilterSerializer], responses=JobSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(JobSerializer(page, many=True).data)

    @extend_schema(
        summary="Create a job",
        request=JobCreateSerializer,
        responses={201: JobDetailSerializer, 409: OpenApiResponse(ConflictSerializer, description="Over quota.")},
    )
    def post(self, request: Request) -> Response:
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            job = services.job_create(organization=request.organization, user=request.user, **serializer.validated_data)
        except services.QuotaExceeded as exc:
            raise Conflict(exc.message, limit=exc.limit) from None
        return _detail(request, job, status.HTTP_201_CREATED)


class JobEstimateView(OrgGenericAPIView):
    """``POST jobs/estimate/``: what a job would cost before it runs (members: the body of ``POST
    jobs/``, validated the same way; nothing is created). Computed in-process from a profile of the
    job's shape or the engine's cost model: it never waits on the engine."""

    required_roles = role_map(POST=Role.MEMBER)
    serializer_class = EstimateSerializer

    @extend_schema(summary="Estimate a job's cost", request=JobCreateSerializer, responses=EstimateSerializer)
    def post(self, request: Request) -> Response:
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        body = {k: v for k, v in serializer.validated_data.items() if k not in ("name", "priority")}
        return Response(EstimateSerializer(services.job_estimate(organization=request.organization, **body)).data)


class JobView(OrgGenericAPIView):
    """Base of the views of one job (``jobs/{job_id}/...``)."""

    def get_object(self) -> Job:
        return selectors.job_row(organization=self.request.organization, pk=self.kwargs["job_id"])

    def get_acted_on(self) -> Job:
        """The job, for an action: members act on their own jobs, admins and owners on anyone's."""
        job = self.get_object()
        if not selectors.may_act_on(membership=self.request.membership, job=job):
            require_role(self.request, Role.ADMIN)  # a 403 saying which role it takes
        return job

    def act(self, service, body: type[serializers.Serializer] = EmptySerializer) -> Response:
        """A lifecycle action: ``service(job=, actor=, **body)`` on the job acted on; a state that
        does not allow it answers 409."""
        job = self.get_acted_on()
        serializer = body(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        try:
            job = service(job=job, actor=self.request.user, **serializer.validated_data)
        except services.InvalidTransition as exc:
            raise Conflict(str(exc)) from None
        return _detail(self.request, job)


class JobDetailView(JobView):
    """``GET jobs/{id}/``: one job with its spec, state, progress and savings so far."""

    required_roles = role_map(GET=Role.VIEWER)
    serializer_class = JobDetailSerializer

    def get_object(self) -> Job:
        return selectors.job_get(organization=self.request.organization, pk=self.kwargs["job_id"])

    @extend_schema(summary="Show a job")
    def get(self, request: Request, job_id: int) -> Response:
        return Response(JobDetailSerializer(self.get_object()).data)


class JobCancelView(JobView):
    """``POST jobs/{id}/cancel/``: stop a job that has not finished, with an optional reason."""

    required_roles = role_map(POST=Role.MEMBER)

    @extend_schema(
        summary="Cancel a job", request=JobCancelSerializer, responses={200: JobDetailSerializer, 409: CONFLICT}
    )
    def post(self, request: Request, job_id: int) -> Response:
        return self.act(services.job_cancel, JobCancelSerializer)


class JobPauseView(JobView):
    """``POST jobs/{id}/pause/``: pause a queued or running job (it keeps its place and progress)."""

    required_roles = role_map(POST=Role.MEMBER)

    @extend_schema(summary="Pause a job", request=None, responses={200: JobDetailSerializer, 409: CONFLICT})
    def post(self, request: Request, job_id: int) -> Response:
        return self.act(services.job_pause)


class JobResumeView(JobView):
    """``POST jobs/{id}/resume/``: resume a paused job."""

    required_roles = role_map(POST=Role.MEMBER)

    @extend_schema(summary="Resume a job", request=None, responses={200: JobDetailSerializer, 409: CONFLICT})
    def post(self, request: Request, job_id: int) -> Response:
        return self.act(services.job_resume)


class JobMetricsView(JobView):
    """``GET jobs/{id}/metrics/``: the job's metrics, one row per step, by step (paginated).
    ``?format=jsonl`` (or ``Accept: application/jsonl``): all of them as ``metrics.jsonl``, each
    step's numbers a line, as ``plexrl train`` writes them (keys sorted)."""

    required_roles = role_map(GET=Role.VIEWER)
    serializer_class = JobMetricSerializer
    renderer_classes = (*api_settings.DEFAULT_RENDERER_CLASSES, JSONLinesRenderer)

    @extend_schema(
        summary="List a job's metrics",
        parameters=[OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "jsonl"],
                                     description="jsonl: every step's numbers, a line each (metrics.jsonl).")],
        responses={(200, "application/json"): JobMetricSerializer(many=True),
                   (200, "application/jsonl"): OpenApiTypes.STR},
    )
    def get(self, request: Request, job_id: int) -> Response:
        metrics = selectors.metrics_of(job=self.get_object())
        if isinstance(request.accepted_renderer, JSONLinesRenderer):
            return Response([row.data for row in metrics])
        page = self.paginate_queryset(metrics)
        return self.get_paginated_response(JobMetricSerializer(page, many=True).data)


class JobEventsView(JobView):
    """``GET jobs/{id}/events/``: the job's events (state changes, logs, ...) by seq;
    ``?after_seq=`` continues from a cursor, ``?kind=`` keeps one kind."""

    required_roles = role_map(GET=Role.VIEWER)
    serializer_class = JobEventSerializer

    @extend_schema(
        summary="List a job's events", parameters=[EventFilterSerializer], responses=JobEventSerializer(many=True)
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = self.get_object()
        filters = EventFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        page = self.paginate_queryset(selectors.events_of(job=job, **filters.validated_data))
        return self.get_paginated_response(JobEventSerializer(page, many=True).data)


class JobArtifactsView(JobView):
    """``GET jobs/{id}/artifacts/``: what a finished job left to download (its final weights as a
    Hugging Face folder), each file with its download URL."""

    required_roles = role_map(GET=Role.VIEWER)
    serializer_class = ArtifactSerializer
    pagination_class = None

    @extend_schema(summary="List a job's artifacts", responses=ArtifactSerializer(many=True))
    def get(self, request: Request, job_id: int) -> Response:
        job = self.get_object()
        out = []
        for name, folder in selectors.artifact_folders(job=job).items():
            files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
            archive = reverse("jobs:job-artifact-archive", args=[job.pk, name])
            out.append({"name": name, "format": "huggingface", "archive_url": request.build_absolute_uri(archive),
                        "files": [
                {"name": p.name, "size_bytes": p.stat().st_size,
                 "url": request.build_absolute_uri(reverse("jobs:job-artifact-file", args=[job.pk, name, p.name]))}
                for p in files]})
        return Response(ArtifactSerializer(out, many=True).data)


class JobArtifactArchiveView(JobView):
    """``GET jobs/{id}/artifacts/{name}.zip``: a whole artifact as one ZIP archive, streamed
    (``jobs.archives``); unpacked, its folder loads with ``transformers`` as it is."""

    required_roles = role_map(GET=Role.VIEWER)

    @extend_schema(summary="Download an artifact as one ZIP archive", responses={(200, "application/zip"): bytes})
    def get(self, request: Request, job_id: int, name: str) -> StreamingHttpResponse:
        job = self.get_object()
        folder = selectors.artifact_folders(job=job).get(name)
        if folder is None or not folder.is_dir():
            raise Http404
        root = f"job-{job.pk}-{name}"
        response = StreamingHttpResponse(zip_stream(folder, root), content_type="application/zip")
        response["Content-Disposition"] = content_disposition_header(True, f"{root}.zip")
        return response


class JobTensorBoardView(JobView):
    """``GET jobs/{id}/tensorboard.zip``: the job's metrics (and its spec, as text) as a TensorBoard
    event file, in a ZIP archive of one folder: ``tensorboard --logdir`` it once unpacked. Written
    by the SDK's exporter (``plexrl_client.trackers``), which ``plexrl jobs export`` runs too."""

    required_roles = role_map(GET=Role.VIEWER)

    @extend_schema(summary="Download the metrics as TensorBoard files", responses={(200, "application/zip"): bytes})
    def get(self, request: Request, job_id: int) -> HttpResponse:
        job = self.get_object()
        return _tensorboard_response([job], f"job-{job.pk}-tensorboard", by_id=False)


class OrganizationTensorBoardView(OrgGenericAPIView):
    """``GET jobs/tensorboard.zip``: every job of the organization (``?state=``, ``?search=`` as the
    list filters them) as TensorBoard event files, one folder a job (``<name>-<id>``), in one ZIP
    archive: ``tensorboard --logdir`` it once unpacked to see the organization's runs together."""

    required_roles = role_map(GET=Role.VIEWER)

    @extend_schema(summary="Download every job's metrics as TensorBoard files", operation_id="jobs_tensorboard_all",
                   parameters=[JobFilterSerializer], responses={(200, "application/zip"): bytes})
    def get(self, request: Request) -> HttpResponse:
        filters = JobFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        jobs = selectors.jobs_of(organization=request.organization, **filters.validated_data)
        return _tensorboard_response(jobs.select_related(None).only("id", "name", "spec"),
                                     f"{request.organization.slug}-tensorboard", by_id=True)


def _tensorboard_response(jobs: Iterable[Job], root: str, *, by_id: bool) -> HttpResponse:
    jobs = list(jobs)
    steps = selectors.metrics_by_job(jobs=jobs)
    runs = (({"id": job.pk, "name": job.name, "spec": job.spec}, steps[job.pk]) for job in jobs)
    response = HttpResponse(tensorboard_archive(runs, root, by_id=by_id), content_type="application/zip")
    response["Content-Disposition"] = content_disposition_header(True, f"{root}.zip")
    return response


class JobArtifactFileView(JobView):
    """``GET jobs/{id}/artifacts/{name}/{file}``: one file of an artifact, streamed."""

    required_roles = role_map(GET=Role.VIEWER)

    @extend_schema(summary="Download an artifact file", responses={(200, "application/octet-stream"): bytes})
    def get(self, request: Request, job_id: int, name: str, filename: str) -> StreamingHttpResponse:
        job = self.get_object()
        folder = selectors.artifact_folders(job=job).get(name)
        if folder is None or "/" in filename or filename.startswith("."):
            raise Http404
        path = folder / filename
        if not path.is_file():
            raise Http404
        response = StreamingHttpResponse(file_stream(path), content_type="application/octet-stream")
        response["Content-Length"] = str(path.stat().st_size)
        response["Content-Disposition"] = content_disposition_header(True, filename)
        return response
