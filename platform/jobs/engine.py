"""The platform's one handle on the engine (``engine.control``, docs/architecture.md §4).

Celery tasks call it, so that a web request never waits on the engine, but for a session's calls
(``jobs.session_views``), whose answers are what the request asks for. ``RAY_ADDRESS`` joins a Ray
cluster; without it the process starts a local Ray the first time a task needs the engine.
"""

from __future__ import annotations

import threading

from django.conf import settings

from engine.control import EngineClient, ServiceConfig

_client: EngineClient | None = None
_lock = threading.Lock()


def tenant_of(organization_id: int) -> str:
    """The organization's tenant name in the engine: whose budget its jobs' calls spend."""
    return f"org-{organization_id}"


def engine() -> EngineClient:
    global _client  # one client per process, made on first use
    with _lock:
        if _client is None:
            _client = EngineClient(address=settings.RAY_ADDRESS, data_dir=settings.PLEXRL_HOME,
                                   config=ServiceConfig(session_idle_s=settings.SESSION_IDLE_S))
        return _client
