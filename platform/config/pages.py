"""The web pages of the dashboard (included at the site root by ``config.urls``).

Thin views: each checks who may see the page, renders a template from ``frontend/templates/pages/``
with a small context, and leaves the data to the page's ES module (``frontend/static/js/``), which
reads the REST API under ``/api/v1/`` and the websockets with the session cookie. What a module
needs to start (the job id, may the user act) is in ``page_data``, rendered with ``json_script``.

Every page acts within the session's current organization, resolved like the API resolves it
(``accounts.api.resolve_organization``); the navigation bar's data comes from the ``navigation``
context processor, so the sign-in pages, which extend the same base template, show it too.
"""

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.utils.functional import SimpleLazyObject
from django.views.generic import RedirectView

from accounts import selectors as account_selectors
from accounts.api import resolve_organization
from accounts.models import Membership, Organization, Priority, Role
from engine.control import DATASET_FORMATS, MAX_DATASET_BYTES
from engine.spec import ROLLOUT_BACKENDS, TRAINER_BACKENDS, default_rollout, default_trainer
from jobs import selectors as job_selectors
from jobs.lineage import lineage as lineage_of
from jobs.models import DeploymentMode, Job, JobState
from jobs.serializers import api_spec_schema


def _current(request: HttpRequest) -> tuple[Organization | None, Membership | None]:
    """The request's organization and membership, resolved once per request (the view and the
    context processor both ask)."""
    if not hasattr(request, "_plexrl_organization"):
        request._plexrl_organization = resolve_organization(request)
    return request._plexrl_organization


def navigation(request: HttpRequest) -> dict[str, Any]:
    """Context processor: ``nav`` for the base template's header, computed only if a template
    reads it (the API's browsable pages never do): the user's organizations with their roles, the
    current one and the current role."""

    def build() -> dict[str, Any]:
        if not request.user.is_authenticated:
            return {"organizations": [], "organization": None, "role": None}
        organization, membership = _current(request)
        return {
            "organizations": list(account_selectors.organizations_of(user=request.user)),
            "organization": organization,
            "role": membership.role if membership else None,
        }

    return {"nav": SimpleLazyObject(build)}


def _page(request: HttpRequest, template: str, *, title: str, module: str, organization_required: bool = True,
          **data: Any) -> HttpResponse:
    """Render a page: ``template`` with ``title``, the ES ``module`` to load (a file of
    ``static/js/``) and ``data`` for it (``page_data``, with ``can_write``: may the user create and
    act on jobs). A page of the organization answers 403 to a user of none, with a notice."""
    organization, membership = _current(request)
    if organization_required and organization is None:
        return render(request, "pages/no_organization.html", {"title": title}, status=403)
    page_data = {
        "organization": organization.pk if organization else None,
        "role": membership.role if membership else None,
        "can_write": bool(membership and membership.has_role(Role.MEMBER)),
        "staff": request.user.is_staff,
        **data,
    }
    return render(request, template, {"title": title, "module": module, "page_data": page_data})


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """``/jobs/``: the organization's jobs with their live state, filterable by state."""
    return _page(request, "pages/job_list.html", title="Jobs", module="jobs.js",
                 states=[{"value": v, "label": label} for v, label in JobState.choices])


def _continuing(request: HttpRequest, organization: Organization | None) -> dict[str, Any] | None:
    """The job the form continues (``?continue_from=ID&weights=final|checkpoint``), or None; another
    organization's job is 404."""
    raw = request.GET.get("continue_from", "")
    if organization is None or not raw.isdigit():
        return None
    parent = job_selectors.job_row(organization=organization, pk=int(raw))
    weights = "checkpoint" if request.GET.get("weights") == "checkpoint" else "final"
    return {"id": parent.pk, "name": parent.name, "weights": weights}


# Spec fields the form draws with choices of the organization's own (task, model, dataset, the
# backends), and the one it never shows (a session is opened on its own: POST sessions/).
FORM_SELECTS = ("task", "model", "dataset", "rollout", "trainer")
NOT_ON_THE_FORM = {"algorithm": "a session is opened on its own (POST /api/v1/sessions/)"}
_FORM_TYPES = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}


def spec_form_fields() -> dict[str, list[dict[str, Any]]]:
    """The submit form's spec fields, drawn from the spec as the API takes it (``api_spec_schema``):
    ``job`` (the top level, but the selects and what is not on the form), ``grpo`` and ``tools``."""
    schema = api_spec_schema()["properties"]

    def fields(properties: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
        out = []
        for name, prop in properties.items():
            path = f"{prefix}{name}"
            if prop.get("type") == "object" or path in FORM_SELECTS or path in NOT_ON_THE_FORM:
                continue
            out.append({"name": f"spec.{path}", "id": "f-" + path.replace(".", "-").replace("_", "-"),
                        "label": prop["x-label"], "type": _FORM_TYPES[prop["type"]], "value": prop.get("default"),
                        "min": None if prop.get("exclusiveMinimum") else prop.get("minimum"),
                        "max": None if prop.get("exclusiveMaximum") else prop.get("maximum"),
                        "choices": prop.get("enum"), "help": prop.get("description", ""), "required": path == "steps"})
        return out

    return {"job": fields(schema, ""), "grpo": fields(schema["grpo"]["properties"], "grpo."),
            "tools": fields(schema["tools"]["properties"], "tools.")}


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    """``/jobs/new/``: the submit form (posts the job as JSON to ``/api/v1/jobs/``); the GRPO
    fields start at the engine's defaults."""
    organization, _ = _current(request)
    plan = organization.plan if organization else None
    return _page(request, "pages/job_new.html", title="Submit a job", module="job_new.js",
                 spec_fields=spec_form_fields(), continues=_continuing(request, organization),
                 deployment_modes=DeploymentMode.choices,
                 # the priorities the organization's plan allows
                 priorities=[(v, label) for v, label in Priority.choices if plan and plan.allows_priority(v)],
                 backends=[
                     {"name": "rollout", "label": "Rollout backend", "choices": list(ROLLOUT_BACKENDS),
                      "default": default_rollout()},
                     {"name": "trainer", "label": "Training backend", "choices": list(TRAINER_BACKENDS),
                      "default": default_trainer()},
                 ])


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    """``/jobs/<id>/``: one job, live (curves, steps, events). Another organization's job is 404."""
    organization, membership = _current(request)
    if organization is None:
        return _page(request, "pages/job_detail.html", title="Job", module="job_detail.js")
    job = job_selectors.job_get(organization=organization, pk=job_id)  # tenant-scoped: 404 otherwise
    folders = job_selectors.artifact_folders(job=job)
    return _page(request, "pages/job_detail.html", title=job.name or f"Job {job.pk}", module="job_detail.js",
                 job=job.pk, job_name=job.name, job_state=job.state,
                 may_act=job_selectors.may_act_on(membership=membership, job=job),
                 downloads=[{"name": name, "url": reverse("jobs:job-artifact-archive", args=[job.pk, name])}
                            for name in folders],
                 tensorboard_url=reverse("jobs:job-tensorboard", args=[job.pk]),
                 lineage=lineage_of(job=job), continue_links=_continue_links(job, membership, folders),
                 ws_path=f"/ws/jobs/{job.pk}/")


def _continue_links(job: Job, membership: Membership | None, folders: dict) -> list[dict[str, str]]:
    """"Continue from this run": a new job from its final weights, or from its latest checkpoint
    (for members, who submit jobs)."""
    if not (membership and membership.has_role(Role.MEMBER)):
        return []
    submit = reverse("pages:job-new")
    links = [{"weights": "final", "label": "Continue from this run (final weights)",
              "url": f"{submit}?continue_from={job.pk}"}] if "final" in folders else []
    if job_selectors.events_of(job=job, kind="checkpoint").exists():
        links.append({"weights": "checkpoint", "label": "Continue from its latest checkpoint",
                      "url": f"{submit}?continue_from={job.pk}&weights=checkpoint"})
    return links


CLUSTER_WINDOWS = ((120, "last 2 minutes"), (600, "last 10 minutes"), (3600, "last hour"))


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    """``/cluster/``: the device timeline of every WPG over a recent window (``?window=`` seconds,
    one of ``CLUSTER_WINDOWS``; ten minutes by default), live."""
    window = request.GET.get("window", "")
    window = int(window) if window.isdigit() and int(window) in dict(CLUSTER_WINDOWS) else 600
    return _page(request, "pages/cluster.html", title="Cluster", module="cluster.js",
                 organization_required=not request.user.is_staff, window=window, windows=CLUSTER_WINDOWS)


@login_required
def billing(request: HttpRequest) -> HttpResponse:
    """``/billing/``: billed against dedicated device-hours per job, the totals and the month."""
    return _page(request, "pages/billing.html", title="Billing", module="billing.js")


@login_required
def staff_savings(request: HttpRequest) -> HttpResponse:
    """``/staff/savings/`` (platform staff only, 403 for others): the cluster's monthly report."""
    if not request.user.is_staff:
        raise PermissionDenied("Only platform staff can see the cluster report.")
    return _page(request, "pages/staff_savings.html", title="Savings across organizations",
                 module="staff_savings.js", organization_required=False)


@login_required
def library(request: HttpRequest) -> HttpResponse:
    """``/library/``: the organization's models and datasets; members upload and delete them."""
    organization, _ = _current(request)
    plan = organization.plan if organization else None
    return _page(request, "pages/library.html", title="Models & data", module="library.js",
                 max_model_bytes=plan.max_model_bytes if plan else None,
                 max_dataset_bytes=min(plan.max_dataset_bytes, MAX_DATASET_BYTES) if plan else None,
                 dataset_formats=list(DATASET_FORMATS))


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    """``/tokens/``: the user's API tokens in the current organization: list, create, revoke."""
    return _page(request, "pages/tokens.html", title="API tokens", module="tokens.js")


COMPARE_MAX = 8  # runs one compare page overlays


def _flat_spec(spec: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, dict):
            out |= _flat_spec(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def spec_differences(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spec fields (dotted, ``grpo.lr``) whose values are not the same in every run, each with
    its value in each run (None where a run has no such field), by name."""
    flat = [_flat_spec(spec) for spec in specs]
    keys = sorted(set().union(*flat))
    return [{"key": key, "values": [f.get(key) for f in flat]} for key in keys
            if len({repr(f.get(key)) for f in flat}) > 1]


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    """``/compare/?jobs=3,5``: the chosen runs' metrics overlaid, one curve a run, and their specs'
    differences as a table. Another organization's job is 404; fewer than two runs, or more than
    ``COMPARE_MAX``, answer 400 with the reason."""
    organization, _ = _current(request)
    raw = [part for part in request.GET.get("jobs", "").split(",") if part.strip()]
    if organization is None or not all(part.strip().isdigit() for part in raw):
        ids: list[int] = []
    else:
        ids = list(dict.fromkeys(int(part) for part in raw))
    if organization is not None and not 2 <= len(ids) <= COMPARE_MAX:
        response = _page(request, "pages/compare.html", title="Compare runs", module="compare.js", runs=[],
                         error=f"Pick 2 to {COMPARE_MAX} runs on the job list to compare them.")
        response.status_code = 400
        return response
    jobs = [job_selectors.job_row(organization=organization, pk=pk) for pk in ids] if organization else []
    return _page(request, "pages/compare.html", title="Compare runs", module="compare.js",
                 runs=[{"id": j.pk, "name": j.name or f"job {j.pk}", "state": j.state} for j in jobs],
                 differences=spec_differences([j.spec for j in jobs]), error="")


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    """``/notifications/``: the e-mails the user gets of their own jobs; for admins and owners, the
    organization's webhooks and each one's delivery log."""
    from notifications.models import JobEvent

    _, membership = _current(request)
    return _page(request, "pages/notifications.html", title="Notifications", module="notifications.js",
                 events=[{"value": v, "label": label} for v, label in JobEvent.choices],
                 manages_webhooks=bool(membership and membership.has_role(Role.ADMIN)))


app_name = "pages"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="pages:jobs"), name="home"),
    path("jobs/", job_list, name="jobs"),
    path("jobs/new/", job_new, name="job-new"),
    path("jobs/<int:job_id>/", job_detail, name="job-detail"),
    path("cluster/", cluster, name="cluster"),
    path("billing/", billing, name="billing"),
    path("staff/savings/", staff_savings, name="staff-savings"),
    path("library/", library, name="library"),
    path("tokens/", tokens, name="tokens"),
    path("notifications/", notifications, name="notifications"),
    path("compare/", compare, name="compare"),
]
