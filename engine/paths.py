"""The one data directory (``PLEXRL_HOME``) and the folders inside it."""

from __future__ import annotations

import os
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


def events_path(data_dir: Path, job_id: str) -> Path:
    return Path(data_dir) / "jobs" / job_id / "events.jsonl"
