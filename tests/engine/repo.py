"""Where the repository is, for the engine tests that start processes from its root."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
