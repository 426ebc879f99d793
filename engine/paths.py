"""The one data directory (``PLEXRL_HOME``) and the folders inside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def plexrl_home() -> Path:
    """``$PLEXRL_HOME`` if set, else ``.plexrl`` in the project checkout."""
    env = os.environ.get("PLEXRL_HOME")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".plexrl"


def models_dir() -> Path:
    return plexrl_home() / "models"


def runs_dir() -> Path:
    return plexrl_home() / "runs"


def default_run_dir(prefix: str) -> Path:
    """A new folder name under ``runs_dir``: ``prefix``, the local time, a counter if that exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = runs_dir() / f"{prefix}-{stamp}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def events_path(data_dir: Path, job_id: str) -> Path:
    return Path(data_dir) / "jobs" / job_id / "events.jsonl"
