"""Model presets: small Hugging Face models built locally (no hub access), and path resolution."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from engine.errors import ModelNotFound
from engine.models.presets import TINY_ARITH, TINY_ARITH_TOOLS, TinyPreset
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


def _build_one(preset: TinyPreset, path: Path, progress: bool, position: int) -> None:
    from engine.models.tiny import build_preset  # torch: in the building process only

    build_preset(preset, path, progress=progress, position=position)


def build_presets(names: list[str] | set[str], *, progress: bool = False) -> list[str]:
    """Build the presets of ``names`` that are not built yet (their names, sorted), side by side:
    one process each, this machine's CPUs shared between them (at most a recipe's own thread count
    each). A preset's bytes do not depend on how many threads build it (``test_tiny_preset.py``),
    so a preset built here equals one built alone; the two presets on 2 CPUs take about 0.7 of the
    time and of the CPU-seconds of building them one after the other on 2 threads each."""
    import concurrent.futures
    import multiprocessing

    missing = sorted(name for name in set(names) if name in PRESETS and not is_model_dir(preset_dir(name)))
    if not missing:
        return []
    if len(missing) == 1:
        _build_one(PRESETS[missing[0]], preset_dir(missing[0]), progress, 0)
        return missing
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cpus // len(missing))
    recipes = [dataclasses.replace(PRESETS[name], threads=min(share, PRESETS[name].threads)) for name in missing]
    # spawn: a fresh interpreter each (no fork of a process that may hold threads, Django or Ray)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(missing), mp_context=context) as pool:
        builds = [pool.submit(_build_one, recipe, preset_dir(recipe.name), progress, i)
                  for i, recipe in enumerate(recipes)]
        for build in builds:
            build.result()  # a build's error is raised here
    return missing
