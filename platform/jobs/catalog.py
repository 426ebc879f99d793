"""The models a job may train: the engine's built-in presets (built on demand by the engine), the
Hugging Face folders published to every organization (registered by platform staff, or uploads they
published) and an organization's own uploads (``jobs.model_uploads``), all ``RegisteredModel``.

A job spec names its model; ``resolve_model`` turns a name the organization sees into its folder
before the engine sees the spec, and checks the job's backends run its architecture. Tenants name
models, never paths: a path could point at anything the server can read (another organization's
checkpoints among them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404

from accounts.models import Organization, User
from engine.control import BACKEND_ARCHITECTURES, PRESETS, configuration_problem
from engine.spec import default_rollout, default_trainer
from jobs.models import RegisteredModel

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def folder_problem(path: Path) -> str | None:
    """Why ``path`` is not a Hugging Face model folder the engine can load, or None."""
    if not path.is_absolute():
        return "must be an absolute path on the server"
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is not a folder"
    if not (path / "config.json").is_file():
        return f"{path} has no config.json"
    if not any(path.glob("*.safetensors")):
        if any(path.glob("*.bin")):
            return f"{path} has only .bin weights; the engine loads *.safetensors (convert them first)"
        return f"{path} has no weights (*.safetensors)"
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return f"{path} has no tokenizer file ({', '.join(TOKENIZER_FILES)})"
    return None


def clean_name(name: str, *, organization: Organization | None) -> str:
    """A model's name, checked: well-formed, not a preset's, not taken among the published models
    nor (for an organization's upload) among the organization's own. ``ValidationError`` by field."""
    name = (name or "").strip()
    if not NAME_RE.match(name):
        raise ValidationError({"name": "use 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or "
                                       "digit"})
    if name in PRESETS:
        raise ValidationError({"name": f"{name!r} is a built-in preset"})
    taken = RegisteredModel.objects.filter(Q(organization__isnull=True) | (
        Q(organization=organization) if organization is not None else Q(pk__in=[])), name=name)
    if taken.exists():
        raise ValidationError({"name": f"a model named {name!r} is already registered"})
    return name


def clean_registration(*, name: str, path: str) -> tuple[str, Path]:
    """The name and the resolved folder of a registration; ``ValidationError`` by field otherwise."""
    errors = {}
    try:
        name = clean_name(name, organization=None)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    folder = Path(path or "").expanduser()
    problem = folder_problem(folder)
    if problem:
        errors["path"] = problem
    if errors:
        raise ValidationError(errors)
    return name, folder.resolve()


def model_register(*, user: User | None, name: str, path: str, description: str = "") -> RegisteredModel:
    """Register a local model folder under ``name`` (platform staff): it must hold config.json,
    *.safetensors weights and a tokenizer file."""
    name, folder = clean_registration(name=name, path=path)
    try:
        with transaction.atomic():
            return RegisteredModel.objects.create(name=name, path=str(folder), description=description,
                                                  registered_by=user)
    except IntegrityError:  # the same name, registered concurrently
        raise ValidationError({"name": f"a model named {name!r} is already registered"}) from None


def models_of(*, organization: Organization | None) -> QuerySet[RegisteredModel]:
    """The registered models an organization sees: the published ones and its own (staff of no
    organization: the published ones)."""
    own = Q(organization=organization) if organization is not None else Q(pk__in=[])
    visible = Q(organization__isnull=True) | own
    return RegisteredModel.objects.filter(visible).select_related("registered_by").order_by("name", "id")


def model_get(*, organization: Organization | None, pk: int) -> RegisteredModel:
    """One model the organization sees; 404 for another organization's."""
    return get_object_or_404(models_of(organization=organization), pk=pk)


def model_entry(model: RegisteredModel) -> dict[str, Any]:
    """A registered model as the catalog lists it."""
    return {"id": model.pk, "name": model.name, "builtin": False,
            "scope": "published" if model.organization_id is None else "organization",
            "path": model.path, "description": model.description, "architecture": model.architecture or None,
            "parameters": model.parameters, "size_bytes": model.size_bytes, "dtype": model.dtype or None,
            "created_at": model.created_at}


def models_catalog(*, organization: Organization | None) -> list[dict[str, Any]]:
    """Every model a job of ``organization`` may name: the presets first (``builtin``), then the
    published ones and its own, by name."""
    presets = [
        {"id": None, "name": name, "builtin": True, "scope": "builtin", "path": None,
         "description": "built-in preset (built on first use)", "architecture": "Qwen2ForCausalLM",
         "parameters": None, "size_bytes": None, "dtype": None, "created_at": None}
        for name in sorted(PRESETS)
    ]
    return presets + [model_entry(m) for m in models_of(organization=organization)]


def _looks_like_a_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith(("~", "."))


def _backend_problem(model: RegisteredModel, spec: dict[str, Any]) -> str | None:
    """Why the job's rollout or trainer backend cannot run the model (its architecture, or what
    the backend needs of its configuration: Megatron's rotary embedding and tensor-parallel
    splits, vLLM's Qwen2 head size), or None. A folder staff registered unchecked is left to the
    engine when its config cannot be read."""
    try:
        config = json.loads((Path(model.path) / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict) or not config.get("architectures"):
        return None if not model.architecture else _architecture_problem(model, spec)
    tp = spec.get("tp") if isinstance(spec.get("tp"), int) else 1
    for side, default in (("rollout", default_rollout), ("trainer", default_trainer)):
        backend = spec.get(side) or default()
        problem = configuration_problem(config, backend, tp) if backend in BACKEND_ARCHITECTURES else None
        if problem:
            return f"{model.name!r} cannot run on the {backend} {side}: {problem}"
    return None


def _architecture_problem(model: RegisteredModel, spec: dict[str, Any]) -> str | None:
    for side, default in (("rollout", default_rollout), ("trainer", default_trainer)):
        backend = spec.get(side) or default()
        if backend in BACKEND_ARCHITECTURES and model.architecture not in BACKEND_ARCHITECTURES[backend]:
            runs = ", ".join(sorted(BACKEND_ARCHITECTURES[backend]))
            return (f"{model.name!r} cannot run on the {backend} {side}: it is a {model.architecture}; "
                    f"{backend} runs {runs}")
    return None


def resolve_model(*, organization: Organization | None, spec: Any) -> Any:
    """The spec with the name of a model the organization sees replaced by its folder (its own
    before a published one of the same name); a built-in preset's name stays (the engine builds
    presets on demand). A path, a name it does not see (another organization's model among them)
    or a model whose architecture the job's backends do not run is refused
    (``ValidationError({"spec.model": ...})``): bad input never reaches the engine."""
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
        return spec
    name = spec["model"]
    if _looks_like_a_path(name):
        raise ValidationError({"spec.model": "name a built-in preset or a model of GET models/, not a path"})
    if name in PRESETS:
        return spec
    seen = models_of(organization=organization).filter(name=name)
    model = seen.filter(organization=organization).first() if organization is not None else None
    model = model or seen.filter(organization__isnull=True).first()
    if model is None:
        known = sorted(PRESETS) + sorted({m.name for m in models_of(organization=organization)})
        raise ValidationError({"spec.model": f"unknown model {name!r}; known: {', '.join(known)}"})
    problem = _backend_problem(model, spec)
    if problem:
        raise ValidationError({"spec.model": problem})
    return {**spec, "model": model.path}
