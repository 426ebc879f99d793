"""PlexRL's top-level entry points: the ``plexrl`` command and the ``platform/`` path helper."""

import sys
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parent / "platform"


def add_platform_to_path() -> Path:
    """Put ``platform/`` (the Django source root) first on ``sys.path``; idempotent.

    Called by ``manage.py``, ``config.asgi`` and ``config.wsgi`` before Django starts, so the apps
    import as ``accounts``, ``jobs``, ``billing`` and ``config``. ``platform/`` has no
    ``__init__.py``: it must never become importable as ``platform``, which is a stdlib module.
    """
    # The absolute path, even when a relative entry (the working directory) already reaches it.
    if str(PLATFORM_DIR) not in sys.path:
        sys.path.insert(0, str(PLATFORM_DIR))
    return PLATFORM_DIR


def main():
    pass
