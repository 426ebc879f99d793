"""Reads of the jobs app. Every query starts from the organization (the tenant), or from a job
that was itself fetched through the organization (``job_get``)."""

from __future__ import annotations

from pathlib import Path

from django.db import connections
from django.db.models import Count, Exists, F, FloatField, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import Http404
from django.shortcuts import get_object_or_404

from accounts.models import Membership, Organization, Role
from accounts.sql import ModelColumns, fetch_one
from jobs.models import ACTIVE_STATES, Job, JobEvent, JobMetric

# ``ordering`` names (``jobs.serializers.JOB_ORDERINGS``) -> what they sort on
_ORDER_BY = {"created_at": "created_at", "latest_reward": "latest_reward", "eval_accuracy": "eval_accuracy",
             "device_hours": "usage_totals__device_seconds", "last_step": "last_step", "name": "name"}


def jobs_of(*, organization: Organization, state: str | None = None, search: str | None = None,
            ordering: str | None = None) -> QuerySet[Job]:
    """The organization's jobs, newest first, each annotated with ``last_step`` (its highest
    metrics step, or None), ``latest_reward`` and ``eval_accuracy`` (the latest step's that has
    one, or None), its usage totals alongside (its cost). ``state``: only jobs in that state;
    ``search``: a piece of the name; ``ordering``: a column of ``_ORDER_BY``, descending with a
    leading "-", jobs without the number last either way (then newest first)."""
    jobs = Job.objects.filter(organization=organization)
    if state:
        jobs = jobs.filter(state=state)
    if search:
        jobs = jobs.filter(name__icontains=search)
    # a correlated subquery on the (job, step) index, evaluated for the rows a page returns; a
    # Max() over a join would aggregate every metrics row of every job before paginating
    steps = JobMetric.objects.filter(job=OuterRef("pk")).order_by("-step")
    jobs = jobs.select_related("created_by", "usage_totals").annotate(
        last_step=Subquery(steps.values("step")[:1]),
        latest_reward=_latest(steps, "reward_mean"), eval_accuracy=_latest(steps, "eval_accuracy"),
    )
    newest = ("-created_at", "-id")
    if not ordering:
        return jobs.order_by(*newest)
    column = F(_ORDER_BY[ordering.removeprefix("-")])
    first = column.desc(nulls_last=True) if ordering.startswith("-") else column.asc(nulls_last=True)
    return jobs.order_by(first, *newest)


def _latest(steps: QuerySet[JobMetric], key: str) -> Subquery:
    """The number ``key`` of the latest step that reported it (evaluations come every few steps)."""
    value = Cast(KeyTextTransform(key, "data"), FloatField())
    latest = steps.filter(data__has_key=key).annotate(value=value).values("value")[:1]
    return Subquery(latest, output_field=FloatField())


def job_get(*, organization: Organization, pk: int) -> Job:
    """One of the organization's jobs (annotated like ``jobs_of``), with its ledger totals (its
    savings, ``billing.selectors.job_savings``), the job it continued and whether any job continued
    it (``has_children``: its lineage reads them only then); 404 for any other."""
    jobs = jobs_of(organization=organization).select_related("usage_totals", "parent")
    jobs = jobs.annotate(has_children=Exists(Job.objects.filter(parent=OuterRef("pk"))))
    return get_object_or_404(jobs, pk=pk)


_JOB = ModelColumns(Job, "j")  # the job read's columns (``job_row``)
_job_sql: dict[str, str] = {}  # {database vendor: the job read's SQL}


def job_row(*, organization: Organization, pk: int) -> Job:
    """One of the organization's jobs, its own columns only: the parent a request for its metrics,
    events, artifacts or an action checks (no annotations to compile and join); 404 for any other.
    Each of a session's calls reads it (``jobs.session_views``), so it is fixed SQL (``accounts.sql``)."""
    connection = connections["default"]
    sql = _job_sql.get(connection.vendor)
    if sql is None:  # table and column names from the model, quoted; the ids are parameters
        table = connection.ops.quote_name(Job._meta.db_table)
        sql = _job_sql[connection.vendor] = (
            f"SELECT {_JOB.sql(connection)} FROM {table} j WHERE j.id = %s AND j.organization_id = %s"  # noqa: S608
        )
    row = fetch_one(sql, [int(pk), organization.pk])
    if row is None:
        raise Http404(f"No {Job._meta.object_name} matches the given query.")
    return _JOB.instance(row, connection)


def active_jobs_count(*, organization: Organization) -> int:
    """How many of the organization's jobs hold a slot against ``max_concurrent_jobs``: sent to the
    engine and not ended (paused ones included: they keep their place)."""
    return Job.objects.filter(organization=organization, state__in=ACTIVE_STATES, waiting_for_slot=False).count()


def slot_counts(*, organization: Organization) -> tuple[int, int]:
    """(jobs holding a slot, jobs waiting queued for one) of the organization, in one query."""
    counts = Job.objects.filter(organization=organization, state__in=ACTIVE_STATES).aggregate(
        holding=Count("pk", filter=Q(waiting_for_slot=False)), waiting=Count("pk", filter=Q(waiting_for_slot=True)))
    return counts["holding"], counts["waiting"]


def metrics_of(*, job: Job, after_seq: int = 0) -> QuerySet[JobMetric]:
    """The job's per-step metrics, by step; ``after_seq``: only those logged after that seq."""
    metrics = JobMetric.objects.filter(job=job)
    if after_seq:
        metrics = metrics.filter(seq__gt=after_seq)
    return metrics.order_by("step")


def metrics_by_job(*, jobs: list[Job]) -> dict[int, list[dict]]:
    """Each job's per-step metrics (``{"step", "data"}`` rows, by step), read in one query."""
    steps: dict[int, list[dict]] = {job.pk: [] for job in jobs}
    for job_id, step, data in JobMetric.objects.filter(job__in=jobs).order_by("job", "step").values_list(
            "job_id", "step", "data"):
        steps[job_id].append({"step": step, "data": data})
    return steps


def artifact_folders(*, job: Job) -> dict[str, Path]:
    """The job's artifact folders by name (``final``: its weights), as its event log announced them
    (``artifact`` events)."""
    return {e.data["name"]: Path(e.data["path"]) for e in events_of(job=job, kind="artifact")}


def events_of(*, job: Job, after_seq: int = 0, kind: str | None = None) -> QuerySet[JobEvent]:
    """The job's events (other than metrics and usage) after ``after_seq``, by seq; ``kind``: only
    that kind (``state``, ``log``, ...)."""
    events = JobEvent.objects.filter(job=job, seq__gt=after_seq)
    if kind:
        events = events.filter(kind=kind)
    return events.order_by("seq")


def may_act_on(*, membership: Membership | None, job: Job) -> bool:
    """Whether the member may cancel, pause or resume the job: members act on their own jobs,
    admins and owners on anyone's (the API's rule; the job page shows its buttons by it)."""
    if membership is None:
        return False
    return membership.has_role(Role.ADMIN) or (membership.has_role(Role.MEMBER)
                                               and job.created_by_id == membership.user_id)
