"""An organization's datasets (its own problems for the ``dataset`` task): upload, delete, reads, and
the resolution of a job spec's ``dataset`` id to the stored file.

An upload (JSONL, CSV or Parquet, its prompt and answer in fields or columns of any name) is
validated by the engine's own loader (``engine.tasks.datasets.parse_dataset``, whose errors name the
line or row) before anything is written. What is stored is the JSONL file the engine reads: a JSONL
upload with the default field names as it came, any other as its problems written out
(``to_jsonl``), so a job on a CSV or Parquet file trains as on the same problems in JSONL. The file
is written atomically (a temporary file renamed into place) and only then is the row created, so no
error leaves a row or a file behind.
A dataset is deleted in a transaction; its file goes once the transaction commits.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from accounts.models import Organization, User
from accounts.services import audit_record
from engine.control import DATASET_FIELDS, MAX_DATASET_BYTES, format_of, parse_dataset, to_jsonl
from engine.errors import DatasetError
from jobs.models import ACTIVE_STATES, Dataset, Job

# The engine refuses a bigger file when the job starts; the platform refuses on upload a file bigger
# than the organization's plan allows (``Plan.max_dataset_bytes``, at most this).
MAX_BYTES = MAX_DATASET_BYTES


class DatasetInUse(Exception):
    """An active job reads the dataset (the API answers 409)."""


def datasets_dir(organization: Organization) -> Path:
    """Where the organization's dataset files live: ``PLEXRL_HOME/datasets/<organization id>/``."""
    return Path(settings.PLEXRL_HOME) / "datasets" / str(organization.pk)


def too_big_message(size: int, limit: int) -> str:
    return f"the file is {size} bytes; the limit is {limit} bytes"


def size_limit(organization: Organization) -> int:
    """The largest dataset the organization may upload (its file and evaluation file together): its
    plan's limit, at most the engine's."""
    return min(organization.plan.max_dataset_bytes, MAX_BYTES)


# --- reads ----------------------------------------------------------------------------------------


def datasets_of(*, organization: Organization) -> QuerySet[Dataset]:
    """The organization's datasets, newest first."""
    return Dataset.objects.filter(organization=organization).select_related("created_by").order_by("-created_at", "-id")


def dataset_get(*, organization: Organization, pk: int) -> Dataset:
    """One of the organization's datasets; 404 for any other."""
    return get_object_or_404(datasets_of(organization=organization), pk=pk)


# --- writes ---------------------------------------------------------------------------------------


def _read_capped(upload: UploadedFile, limit: int, field: str = "file") -> bytes:
    """The upload's bytes, refusing it as soon as it passes ``limit`` (whatever its size claimed)."""
    chunks, total = [], 0
    for chunk in upload.chunks():
        total += len(chunk)
        if total > limit:
            raise ValidationError({field: too_big_message(upload.size if upload.size > limit else total, limit)})
        chunks.append(chunk)
    return b"".join(chunks)


def _write_atomically(directory: Path, data: bytes) -> Path:
    """Write ``data`` to a new ``<uuid>.jsonl`` in ``directory``: a temporary file, flushed, then
    renamed into place, so the final name never holds a partial file."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{uuid.uuid4()}.jsonl"
    tmp = directory / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def _problems_file(upload: UploadedFile, field: str, *, fmt: str | None, columns: tuple[str, str],
                   limit: int) -> tuple[bytes, int, str]:
    """An uploaded file of problems checked and made the JSONL the engine reads: (its bytes, how many
    problems, its format). ``ValidationError({field: ...})`` naming the line or row otherwise."""
    if upload.size is not None and upload.size > limit:  # before reading any of it
        raise ValidationError({field: too_big_message(upload.size, limit)})
    data = _read_capped(upload, limit, field)
    fmt = fmt or format_of(upload.name or "")
    try:
        problems = parse_dataset(data, fmt, prompt=columns[0], answer=columns[1])
    except DatasetError as exc:
        raise ValidationError({field: str(exc)}) from None
    if (fmt, tuple(columns)) != ("jsonl", DATASET_FIELDS):
        data = to_jsonl(problems)
        if len(data) > limit:  # a Parquet file's problems may not fit once written out
            raise ValidationError({field: f"its problems written as JSONL take {len(data)} bytes; "
                                          f"the limit is {limit} bytes"})
    return data, len(problems), fmt


def dataset_create(*, organization: Organization, user: User | None, name: str, upload: UploadedFile,
                   fmt: str | None = None, columns: tuple[str, str] = DATASET_FIELDS,
                   eval_upload: UploadedFile | None = None) -> Dataset:
    """Validate an uploaded file of problems (``fmt``: JSONL, CSV or Parquet; None: by the file's
    name), its prompt and answer in ``columns``, and store it as one of the organization's datasets;
    ``eval_upload``: a second file, in the same format and columns, that jobs on the dataset
    evaluate on (the whole first file then trains; without one, a held-out split of it).

    Raises ``ValidationError`` ({"name": ...}, {"file": "line 7: ..."} or {"eval_file": ...}) and
    then creates nothing."""
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "must not be blank"})
    if upload is None:
        raise ValidationError({"file": "no file was submitted"})
    limit = size_limit(organization)
    if Dataset.objects.filter(organization=organization, name=name).exists():
        raise ValidationError({"name": f"a dataset named {name!r} already exists"})
    data, problems, fmt = _problems_file(upload, "file", fmt=fmt, columns=columns, limit=limit)
    # the plan's limit is the dataset's: what the training file leaves of it is the evaluation file's
    evaluation = (None if eval_upload is None else
                  _problems_file(eval_upload, "eval_file", fmt=fmt, columns=columns, limit=limit - len(data)))
    written = [_write_atomically(datasets_dir(organization), data)]
    try:
        if evaluation is not None:
            written.append(_write_atomically(datasets_dir(organization), evaluation[0]))
        with transaction.atomic():
            dataset = Dataset.objects.create(
                organization=organization, name=name, path=str(written[0]), problems=problems, size_bytes=len(data),
                eval_path=str(written[1]) if evaluation else "", eval_problems=evaluation[1] if evaluation else None,
                created_by=user)
            audit_record(organization=organization, actor=user, action="dataset.created",
                         target=f"dataset-{dataset.pk}",
                         data={"name": name, "problems": problems, "size_bytes": len(data), "format": fmt,
                               "columns": list(columns), "eval_problems": dataset.eval_problems})
    except IntegrityError:  # the same name, uploaded concurrently
        for path in written:
            path.unlink(missing_ok=True)
        raise ValidationError({"name": f"a dataset named {name!r} already exists"}) from None
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return dataset


def dataset_delete(*, dataset: Dataset, actor: User | None) -> None:
    """Delete the dataset, unless an active job reads it (``DatasetInUse``); its file goes once the
    transaction commits."""
    with transaction.atomic():
        # job_create holds the same lock while it checks and creates a job
        Organization.objects.select_for_update().get(pk=dataset.organization_id)
        dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
        users = Job.objects.filter(organization_id=dataset.organization_id, state__in=ACTIVE_STATES,
                                   spec__dataset=dataset.path).order_by("id")
        if users.exists():
            ids = ", ".join(str(pk) for pk in users.values_list("pk", flat=True)[:5])
            raise DatasetInUse(f"active jobs read this dataset (ids {ids}); cancel them or wait for them to finish")
        paths = [Path(p) for p in (dataset.path, dataset.eval_path) if p]
        audit_record(organization=dataset.organization, actor=actor, action="dataset.deleted",
                     target=f"dataset-{dataset.pk}", data={"name": dataset.name})
        dataset.delete()
        transaction.on_commit(lambda: [path.unlink(missing_ok=True) for path in paths])


# --- jobs on datasets -----------------------------------------------------------------------------


def resolve_dataset(*, organization: Organization, spec: Any) -> Any:
    """The spec with its ``dataset`` (the id of one of the organization's datasets) replaced by the
    stored file's path, for the engine. A spec without one comes back as it was.

    Raises ``ValidationError({"spec.dataset": ...})`` for anything but one of the organization's
    dataset ids: another organization's, an unknown id, or a path (a tenant never names files)."""
    if isinstance(spec, dict) and "eval_dataset" in spec:
        raise ValidationError({"spec.eval_dataset": "comes with the dataset (its evaluation file), not by hand"})
    if not isinstance(spec, dict) or spec.get("dataset") is None:
        return spec
    value = spec["dataset"]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError({"spec.dataset": "must be the id of one of your organization's datasets "
                                               "(GET datasets/)"})
    paths = Dataset.objects.filter(organization=organization, pk=value).values_list("path", "eval_path").first()
    if paths is None:
        raise ValidationError({"spec.dataset": f"no dataset {value} in your organization"})
    return {**spec, "dataset": paths[0], "eval_dataset": paths[1] or None}
