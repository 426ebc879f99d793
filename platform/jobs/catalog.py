"""The models a job may train: the engine's built-in presets (built on demand by the engine) and the
local Hugging Face folders platform staff registered by name (``RegisteredModel``).

A job spec names its model; ``resolve_model`` turns a registered name into its folder before the
engine sees the spec. Tenants name models, never paths: a path could point at anything the server
can read (another organization's checkpoints among them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts.models import User
from engine.control import PRESETS
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


def clean_registration(*, name: str, path: str) -> tuple[str, Path]:
    """The name and the resolved folder of a registration; ``ValidationError`` by field otherwise."""
    errors = {}
    name = (name or "").strip()
    if not NAME_RE.match(name):
        errors["name"] = "use 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"
    elif name in PRESETS:
        errors["name"] = f"{name!r} is a built-in preset"
    elif RegisteredModel.objects.filter(name=name).exists():
        errors["name"] = f"a model named {name!r} is already registered"
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


def models_catalog() -> list[dict[str, Any]]:
    """Every model a job may name: the presets first (``builtin``), then the registered ones by name."""
    presets = [
        {"name": name, "builtin": True, "path": None, "description": "built-in preset (built on first use)",
         "created_at": None}
        for name in sorted(PRESETS)
    ]
    registered = [
        {"name": m.name, "builtin": False, "path": m.path, "description": m.description, "created_at": m.created_at}
        for m in RegisteredModel.objects.order_by("name")
    ]
    return presets + registered


def _looks_like_a_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith(("~", "."))


def resolve_model(*, spec: Any) -> Any:
    """The spec with a registered model's name replaced by its folder; a built-in preset's name
    stays (the engine builds presets on demand). A path or a name that is neither is refused
    (``ValidationError({"spec.model": ...})``): bad input never reaches the engine."""
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
        return spec
    name = spec["model"]
    if _looks_like_a_path(name):
        raise ValidationError({"spec.model": "name a built-in preset or a registered model (GET models/), "
                                             "not a path"})
    if name in PRESETS:
        return spec
    path = RegisteredModel.objects.filter(name=name).values_list("path", flat=True).first()
    if path is None:
        known = sorted(PRESETS) + list(RegisteredModel.objects.order_by("name").values_list("name", flat=True))
        raise ValidationError({"spec.model": f"unknown model {name!r}; known: {', '.join(known)}"})
    return {**spec, "model": path}
