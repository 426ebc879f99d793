"""Puts ``platform/`` (the Django source root) on ``sys.path``: the one helper that ``manage.py``,
``config.asgi``, ``config.wsgi``, the Celery app and the ``plexrl`` command share.

A module of its own, importing nothing of the project: the Django side imports it, and the
``plexrl`` command (which imports the Django side to serve) does too, with no cycle between them.
"""

import sys
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parent / "platform"


def add_platform_to_path() -> Path:
    """Put ``platform/`` first on ``sys.path``; idempotent.

    The apps then import as ``accounts``, ``jobs``, ``billing`` and ``config``. ``platform/`` has no
    ``__init__.py``: it must never become importable as ``platform``, which is a stdlib module.
    """
    # The absolute path, even when a relative entry (the working directory) already reaches it.
    if str(PLATFORM_DIR) not in sys.path:
        sys.path.insert(0, str(PLATFORM_DIR))
    return PLATFORM_DIR
