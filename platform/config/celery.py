"""The Celery app: ``celery -A config worker`` (from ``platform/``) or ``plexrl``'s embedded worker.

Broker: Redis at ``REDIS_URL`` in production; without it, an in-memory broker for the embedded,
single-process setup (the worker then runs inside the web process). Tasks that reach the engine
live in ``jobs/tasks.py`` and ``billing/tasks.py``; the beat schedule is in the settings.
"""

import os
import sys
from pathlib import Path

from celery import Celery
from celery.signals import worker_process_init

try:
    import platform_path
except ModuleNotFoundError:  # a checkout that was never pip-installed: platform_path.py is at its root
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    import platform_path

platform_path.add_platform_to_path()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("plexrl")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _own_connection_pools(**kwargs) -> None:
    """A prefork worker's child starts with its own database connection pools: a pool the parent
    opened before the fork holds sockets the two processes would otherwise share."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        close_pool = getattr(connection, "close_pool", None)  # PostgreSQL's backend only
        if close_pool is not None:
            close_pool()  # without a pool (or an unopened one) nothing to close
