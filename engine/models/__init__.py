"""Model presets: small Hugging Face models built locally (no hub access), and path resolution."""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelNotFound
from engine.models.presets import TINY_ARITH, TINY_ARITH_TOOLS
from engine.paths import models_dir

PRESETS = {p.name: p for p in (TINY_ARITH, TINY_ARITH_TOOLS)}


def preset_dir(name: str) -> Path:
    return models_dir() / name


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resolve_model(name_or_path: str, *, build_missing: bool = True, progress: bool = False) -> Path:
    """A preset name (built into ``PLEXRL_HOME/models`` on first use) or a local HF model folder."""
    if name_or_path in PRESETS:
        path = preset_dir(name_or_path)
        if not is_model_dir(path):
            if not build_missing:
                raise ModelNotFound(f"preset {name_or_path!r} is not built; run `plexrl models build {name_or_path}`")
            from engine.models.tiny import build_preset  # torch: only when a preset is built

            build_preset(PRESETS[name_or_path], path, progress=progress)
        return path
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(sorted(PRESETS))
        raise ModelNotFound(f"model {name_or_path!r}: no such preset ({known}) or directory")
    if not is_model_dir(path):
        raise ModelNotFound(f"model {name_or_path!r}: not a Hugging Face model folder (config.json + *.safetensors)")
    return path.resolve()
