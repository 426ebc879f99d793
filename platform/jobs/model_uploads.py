"""An organization's own models: a Hugging Face model folder its members upload, kept for that
organization alone (``RegisteredModel`` with its ``organization``), deleted by them, published to
every organization by platform staff.

An upload is the folder's files (flat: ``config.json``, ``*.safetensors``, tokenizer files). Each
file's name is checked before it is read (no pickle, no code), the total against the plan's
``max_model_bytes``; the files are written to a temporary folder, which the engine's
``check_model_folder`` then reads (the architecture one of its backends runs, every tensor the
config's architecture needs with its shape, the tokenizer). Only a folder that passes is renamed
into place under ``PLEXRL_HOME/model-uploads/<organization id>/`` and its row created; any error
removes the temporary folder, so nothing is stored.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from accounts.models import Organization, User
from accounts.services import audit_record
from engine.control import check_model_folder, model_file_problem
from engine.errors import ModelInvalid
from jobs.catalog import clean_name
from jobs.models import ACTIVE_STATES, Job, RegisteredModel


class ModelInUse(Exception):
    """An active job trains the model (the API answers 409)."""


def uploads_dir(organization: Organization) -> Path:
    return Path(settings.PLEXRL_HOME) / "model-uploads" / str(organization.pk)


def too_big_message(size: int, limit: int) -> str:
    return f"the model is {size} bytes; the plan allows {limit} bytes"


# --- writes ---------------------------------------------------------------------------------------


def _write_files(files: list[UploadedFile], folder: Path, limit: int) -> None:
    """Each upload into ``folder`` under its own name, counting bytes as they come (whatever the
    sizes claimed) against ``limit``."""
    folder.mkdir(parents=True)
    total = 0
    for upload in files:
        with open(folder / upload.name, "wb") as out:
            for chunk in upload.chunks():
                total += len(chunk)
                if total > limit:
                    raise ValidationError({"files": too_big_message(total, limit)})
                out.write(chunk)


def _clean_files(files: list[UploadedFile], limit: int) -> None:
    if not files:
        raise ValidationError({"files": "no files were submitted (the model folder's config.json, *.safetensors "
                                        "and tokenizer files)"})
    names = [f.name or "" for f in files]
    for name in names:
        if not name or name.startswith(".") or "/" in name or "\\" in name:
            raise ValidationError({"files": f"{name!r}: not a file name a model folder holds"})
        problem = model_file_problem(name)
        if problem:
            raise ValidationError({"files": problem})
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValidationError({"files": f"{twice[0]} was sent twice"})
    claimed = sum(f.size or 0 for f in files)
    if claimed > limit:  # before any of it is written
        raise ValidationError({"files": too_big_message(claimed, limit)})


def model_upload(*, organization: Organization, user: User | None, name: str, files: list[UploadedFile],
                 description: str = "") -> RegisteredModel:
    """Check an uploaded model folder and keep it as one of the organization's models. Raises
    ``ValidationError`` ({"name": ...} or {"files": ...}) and then stores nothing."""
    name = clean_name(name, organization=organization)
    limit = organization.plan.max_model_bytes
    _clean_files(files, limit)
    root = uploads_dir(organization)
    tmp, final = root / f".upload-{uuid.uuid4()}", root / str(uuid.uuid4())
    try:
        _write_files(files, tmp, limit)
        try:
            facts = check_model_folder(tmp)
        except ModelInvalid as exc:
            raise ValidationError({"files": str(exc)}) from None
        tmp.rename(final)
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                organization=organization, name=name, path=str(final), description=description,
                architecture=facts["architecture"], parameters=facts["parameters"], size_bytes=facts["size_bytes"],
                dtype=facts["dtype"], registered_by=user)
            audit_record(organization=organization, actor=user, action="model.uploaded", target=f"model-{model.pk}",
                         data={"name": name, **{k: facts[k] for k in ("architecture", "parameters", "size_bytes")}})
    except IntegrityError:  # the same name, uploaded concurrently
        shutil.rmtree(final, ignore_errors=True)
        raise ValidationError({"name": f"a model named {name!r} already exists"}) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        raise
    return model


def _jobs_on(model: RegisteredModel) -> QuerySet[Job]:
    jobs = Job.objects.filter(state__in=ACTIVE_STATES, spec__model=model.path)
    return jobs.filter(organization_id=model.organization_id) if model.organization_id else jobs


def model_delete(*, model: RegisteredModel, actor: User | None) -> None:
    """Delete the model, unless an active job trains it (``ModelInUse``); an uploaded folder goes
    once the transaction commits (a folder staff registered stays: it was never the platform's)."""
    with transaction.atomic():
        if model.organization_id is not None:  # job_create holds the same lock while it checks and creates a job
            Organization.objects.select_for_update().get(pk=model.organization_id)
        model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        users = _jobs_on(model).order_by("id")
        if users.exists():
            ids = ", ".join(str(pk) for pk in users.values_list("pk", flat=True)[:5])
            raise ModelInUse(f"active jobs train this model (ids {ids}); cancel them or wait for them to finish")
        path = Path(model.path)
        uploaded = path.parent.parent == Path(settings.PLEXRL_HOME) / "model-uploads"
        audit_record(organization=model.organization, actor=actor, action="model.deleted", target=f"model-{model.pk}",
                     data={"name": model.name})
        model.delete()
        if uploaded:
            transaction.on_commit(lambda: shutil.rmtree(path, ignore_errors=True))


def model_publish(*, model: RegisteredModel, actor: User | None) -> RegisteredModel:
    """Make an organization's uploaded model one every organization sees (platform staff)."""
    if model.organization_id is None:
        raise ValidationError({"model": "it is already published"})
    clean_name(model.name, organization=None)
    with transaction.atomic():
        owner = model.organization
        model.organization = None
        try:
            with transaction.atomic():
                model.save(update_fields=["organization"])
        except IntegrityError:
            raise ValidationError({"name": f"a published model is already named {model.name!r}"}) from None
        audit_record(organization=owner, actor=actor, action="model.published", target=f"model-{model.pk}",
                     data={"name": model.name})
    return model
