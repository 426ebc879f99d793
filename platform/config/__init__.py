"""Project configuration: settings from the environment, URLs, ASGI and WSGI entry points, and the
Celery app (imported here so ``shared_task`` senders use it wherever Django starts)."""

from config.celery import app as celery_app

__all__ = ("celery_app",)
