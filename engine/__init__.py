"""PlexRL engine: model execution as a shared, time-sliced service.

Never imports Django or anything under ``platform/``. Algorithm code calls the function API
(``engine.client``); the platform holds the service client (``engine.control.EngineClient``) and
reads ``engine.spec``, ``engine.errors`` and ``engine.paths``. The packages are layers:
docs/architecture.md §3 draws them.
"""
