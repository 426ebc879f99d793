"""The whole platform in one process tree, for one command on a fresh machine (DESIGN section 8):
the ASGI server (daphne) in the main thread, a Celery worker and its beat in threads of the same
process (in-memory broker), the engine on a local Ray cluster this process starts, SQLite and the
in-memory channel layer, everything under ``PLEXRL_HOME``. ``plexrl up`` runs it; ``plexrl demo``
also creates a demo organization and submits demo jobs. The same code paths as production: only
the settings differ (no ``DATABASE_URL``, ``REDIS_URL`` or ``RAY_ADDRESS``).

Ctrl-C (or ``stop()``) stops the server, then the beat, the worker, the engine and Ray: nothing is
left running. A second run reuses the data directory (database, models, event logs).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("plexrl.embedded")


def setup_django() -> None:
    """Django, configured from the environment (the embedded defaults when nothing is set)."""
    import django

    import plexrl

    plexrl.add_platform_to_path()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()


@dataclass
class EmbeddedPlatform:
    """Start with ``start()`` (migrations, engine, worker, beat), serve with ``serve()`` (blocks until
    Ctrl-C or ``stop()``), and ``close()`` in a ``finally``."""

    host: str = "127.0.0.1"
    port: int = 8000
    _worker: object | None = None
    _worker_thread: threading.Thread | None = None
    _beat: object | None = None
    _engine_started: bool = False
    _on_ready: list[Callable[[], None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        from celery.beat import EmbeddedService
        from django.core.management import call_command

        from config.celery import app
        from jobs.engine import engine

        call_command("migrate", interactive=False, verbosity=0)
        engine()  # the local Ray cluster and the engine service, started from the main thread
        self._engine_started = True
        self._worker = app.WorkController(pool_cls="solo", concurrency=1, hostname="embedded@plexrl",
                                          without_gossip=True, without_mingle=True, without_heartbeat=True)
        self._worker_thread = threading.Thread(target=self._worker.start, name="celery-worker", daemon=True)
        self._worker_thread.start()
        self._beat = EmbeddedService(app, thread=True)
        self._beat.start()

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the server listens."""
        self._on_ready.append(callback)

    def serve(self) -> None:
        """Serve the ASGI application until Ctrl-C (SIGINT/SIGTERM) or ``stop()``."""
        from daphne.server import Server

        from config.asgi import application

        server = Server(application, endpoints=[f"tcp:port={self.port}:interface={self.host}"],
                        signal_handlers=True, verbosity=0, ready_callable=self._ready)
        server.run()

    def _ready(self) -> None:
        for callback in self._on_ready:
            callback()

    @staticmethod
    def stop() -> None:
        """Stop serving (from any thread): ``serve()`` returns."""
        from twisted.internet import reactor

        reactor.callFromThread(reactor.stop)

    def close(self) -> None:
        """Stop the beat, the worker, the engine and Ray; idempotent."""
        if self._beat is not None:
            self._beat.stop()
            self._beat = None
        if self._worker is not None:
            self._worker.stop(in_sighandler=False)
            self._worker_thread.join(timeout=30)
            self._worker = None
        if self._engine_started:
            import ray

            from jobs.engine import engine

            try:
                engine().shutdown()
            except Exception:  # the engine died already; Ray's shutdown below still cleans up
                log.exception("engine shutdown failed")
            ray.shutdown()
            self._engine_started = False


def port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def missing_presets() -> list[str]:
    """The built-in model presets not built under ``PLEXRL_HOME/models`` yet."""
    from engine.models import PRESETS
    from engine.paths import models_dir

    return [name for name in PRESETS if not (models_dir() / name / "config.json").exists()]


def up(*, host: str, port: int, open_browser: bool) -> int:
    """``plexrl up``: serve the platform until Ctrl-C; 0 on a clean stop."""
    setup_django()
    from django.conf import settings

    platform = EmbeddedPlatform(host=host, port=port)
    print(f"PlexRL: data in {settings.PLEXRL_HOME}; starting the engine and the worker…", flush=True)
    try:
        platform.start()
        for name in missing_presets():
            print(f"  model preset {name!r} is not built yet: plexrl models build {name}", flush=True)

        def ready() -> None:
            print(f"PlexRL is up at {platform.url}/  (Ctrl-C stops it)", flush=True)
            if open_browser:
                import webbrowser

                webbrowser.open(f"{platform.url}/")

        platform.when_ready(ready)
        platform.serve()
    finally:
        print("PlexRL: stopping…", flush=True)
        platform.close()
    print("PlexRL: stopped.", flush=True)
    return 0
