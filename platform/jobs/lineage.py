"""Runs that continue from runs: a new job starts from the weights of an earlier job of the same
organization, its final weights (the ``final`` folder it exported when it succeeded) or its latest
checkpoint (any job that logged one, a cancelled or failed one too).

``continued_spec`` turns the tenant's ``continue_from`` (a job id) into what the engine reads: the
final folder as the spec's ``model``, or the checkpoint's folder as ``init_from`` beside the parent's
model (whose config and tokenizer the checkpoint's weights go with). A tenant names jobs, never
paths: ``init_from`` in a submitted spec is refused, and another organization's job is unknown.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from accounts.models import Organization
from jobs.models import Job
from jobs.selectors import artifact_folders, events_of

WEIGHTS = ("final", "checkpoint")


def refuse_paths(spec: Any) -> None:
    """A submitted spec may not name a checkpoint folder itself."""
    if isinstance(spec, dict) and "init_from" in spec:
        raise ValidationError({"spec.init_from": "set by continue_from (a job of your organization), not by hand"})


def continued_spec(*, organization: Organization, spec: dict[str, Any], continue_from: int | None,
                   weights: str = "final") -> tuple[dict[str, Any], Job | None]:
    """The spec (its model and datasets already resolved to paths) starting from ``continue_from``'s
    ``weights``, and that parent job; the spec as it was and None without one. Field errors
    (``ValidationError``) for a job the organization does not have, weights it never wrote, or a
    spec that names a model of its own."""
    if continue_from is None:
        return spec, None
    if weights not in WEIGHTS:
        raise ValidationError({"continue_weights": f"must be one of {', '.join(WEIGHTS)}"})
    parent = Job.objects.filter(organization=organization, pk=continue_from).first()
    if parent is None:
        raise ValidationError({"continue_from": f"no job {continue_from} in your organization"})
    if "model" in spec and spec["model"] is not None:
        raise ValidationError({"spec.model": f"a job continuing job {parent.pk} trains its model; leave the model out"})
    if weights == "final":
        final = artifact_folders(job=parent).get("final")
        if final is None:
            raise ValidationError({"continue_from": f"job {parent.pk} has no final weights (only a job that "
                                                    "succeeded exports them); continue from its checkpoint"})
        return {**spec, "model": str(final)}, parent
    checkpoint = events_of(job=parent, kind="checkpoint").last()
    if checkpoint is None:
        raise ValidationError({"continue_from": f"job {parent.pk} has logged no checkpoint"})
    return {**spec, "model": parent.spec["model"], "init_from": checkpoint.data["path"]}, parent


def lineage(*, job: Job) -> dict[str, Any]:
    """Where the job's weights came from and which of the organization's jobs went on from it (no
    query for either when ``jobs.selectors.job_get`` fetched the job: its parent is joined, and
    its children are read only when it has some)."""
    parent = job.parent
    children: QuerySet[Job] | list = []
    if getattr(job, "has_children", True):
        children = Job.objects.filter(organization_id=job.organization_id, parent=job).order_by("id").only(
            "id", "name", "parent_weights")
    return {
        "parent": None if parent is None else {"id": parent.pk, "name": parent.name, "weights": job.parent_weights},
        "children": [{"id": c.pk, "name": c.name, "weights": c.parent_weights} for c in children],
    }
