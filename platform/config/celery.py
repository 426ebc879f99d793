"""The Celery app: ``celery -A config worker`` (from ``platform/``) or ``plexrl``'s embedded worker.

Broker: Redis at ``REDIS_URL`` in production; without it, an in-memory broker for the embedded,
single-process setup (the worker then runs inside the web process). Tasks that reach the engine
live in ``jobs/tasks.py`` and ``billing/tasks.py``; the beat schedule is in the settings.
"""

import os
import sys
from pathlib import Path

from celery import Celery

try:
    import plexrl
except ModuleNotFoundError:  # a checkout that was never pip-installed: plexrl.py is at its root
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    import plexrl

plexrl.add_platform_to_path()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("plexrl")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
