"""The whole platform in one process tree, for one command on a fresh machine (docs/architecture.md §7):
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
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("plexrl.embedded")


def setup_django() -> None:
    """Django, configured from the environment (the embedded defaults when nothing is set)."""
    import django

    import platform_path

    platform_path.add_platform_to_path()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()


STOP_BEAT_S = 10.0
STOP_WORKER_S = 30.0  # a warm shutdown: the task it is running may finish


def _bounded(stop: Callable[[], object], seconds: float, what: str) -> None:
    """Run ``stop`` for at most ``seconds`` (in a daemon thread); say so when it did not finish."""
    thread = threading.Thread(target=stop, name=f"stop {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        print(f"PlexRL: {what} did not stop within {seconds:.0f} s; stopping the rest", flush=True)
        log.warning("%s did not stop within %.0f s", what, seconds)


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
        """Stop the beat, the worker, the engine and Ray; idempotent. Each of the beat and the
        worker gets a bounded time (their threads are daemons): one that hangs is named and left
        behind, and the engine and Ray still stop."""
        if self._beat is not None:
            _bounded(self._beat.stop, STOP_BEAT_S, "the Celery beat")
            self._beat = None
        if self._worker is not None:
            worker, thread = self._worker, self._worker_thread
            _bounded(lambda: (worker.stop(in_sighandler=False), thread.join()), STOP_WORKER_S, "the Celery worker")
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


def install_signal_handlers() -> None:
    """Ctrl-C (SIGINT) stops the platform even if this process was started with SIGINT ignored,
    as a shell starts its background jobs (``cmd &``) and everything they run: Python then keeps
    SIGINT ignored and the server would not install its handler. And ``kill -USR1`` prints every
    thread's stack to stderr (from C: it works while a thread holds the interpreter), to see where
    a platform process that does not answer or stop is. Main thread, before serving (``plexrl
    up`` and ``plexrl demo`` call it first)."""
    import faulthandler
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


EXIT_GRACE_S = 20.0


def exit_within(code: int, grace: float = EXIT_GRACE_S) -> None:
    """After a stop: make sure the process ends with ``code`` within ``grace`` seconds.

    Everything the platform started is stopped by then, but the interpreter's exit still joins
    third-party threads (the server's, Ray's, thread pools); one that never returns would keep a
    stopped platform's process alive after Ctrl-C. A daemon watchdog prints the stacks of whatever
    is still running (so the stall can be fixed where it is) and ends the process."""
    import faulthandler

    def watch() -> None:
        time.sleep(grace)
        print(f"PlexRL: the process did not exit within {grace:.0f} s of stopping; still running:",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stdout.flush()
        os._exit(code)

    threading.Thread(target=watch, name="exit-watchdog", daemon=True).start()


def port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def missing_presets(names=None) -> list[str]:
    """The built-in model presets (or those of ``names``) not built under ``PLEXRL_HOME`` yet."""
    from engine.control import PRESETS, is_model_dir, preset_dir

    return [name for name in sorted(names or PRESETS) if not is_model_dir(preset_dir(name))]


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


# --- plexrl demo -------------------------------------------------------------------------------------

DEMO_ORGANIZATION = "Demo Lab"
DEMO_USER = "admin"
CREDENTIALS_FILE = "demo-credentials.json"
# Four jobs of different shapes, as they would come from four teams: two default-shaped ones, a
# rollout-heavy one (fewer updates a step) and one whose answers call a calculator (its tool stalls
# are gaps the others fill). Torch backends: they start in seconds on a laptop; the GPU build uses
# vLLM and Megatron. The default-shaped jobs take the GRPO defaults but 512 prompts a step (the
# default is 1024, for `plexrl train`'s 150 steps): measured alone on 2 cores (torch backends, 40
# steps), held-out accuracy 0.208 -> 0.277 (seed 1), mean of the last three evaluations; 256
# prompts at lr 4e-4 gained -0.005 to +0.007 on the same base.
_DEMO_GRPO = {"prompts_per_step": 512, "eval_every": 10, "eval_size": 500}
DEMO_JOBS = (
    {"name": "arith · default", "spec": {"task": "arith", "model": "tiny-arith", "steps": 40, "seed": 0,
                                         "rollout": "torch", "trainer": "torch", "grpo": _DEMO_GRPO}},
    {"name": "arith · another seed", "spec": {"task": "arith", "model": "tiny-arith", "steps": 40, "seed": 1,
                                              "rollout": "torch", "trainer": "torch", "grpo": _DEMO_GRPO}},
    # half the trainer calls a step at a higher rate: alone (40 steps) 0.208 -> 0.261
    {"name": "arith · rollout-heavy", "spec": {"task": "arith", "model": "tiny-arith", "steps": 40, "seed": 2,
                                               "rollout": "torch", "trainer": "torch",
                                               "grpo": {**_DEMO_GRPO, "updates_per_step": 4, "lr": 4e-4}}},
    # 256 prompts a step stall ~20 s a step on their calculator calls; 64 with shorter calls learn
    # as surely (alone: held-out 0.378 -> 1.0 by step 10) at ~10 s a step.
    {"name": "calculator tool · stalls", "spec": {"task": "arith-tools", "model": "tiny-arith-tools", "steps": 30,
                                                  "seed": 3, "rollout": "torch", "trainer": "torch",
                                                  "grpo": {**_DEMO_GRPO, "prompts_per_step": 64, "updates_per_step": 4,
                                                           "lr": 4e-4, "warmup_steps": 5, "temperature": 1.0},
                                                  "tools": {"latency_median_s": 0.5, "latency_p99_s": 2.0}}},
)


# The demo organization's plan, set by its admin (platform staff) as staff would: every demo job
# runs at once (the default plan would queue the third), sharing the engine's groups.
DEMO_PLAN = {"name": "demo", "description": "The demo organization's: its jobs run side by side.",
             "device_hours_per_month": 1000, "max_concurrent_jobs": len(DEMO_JOBS), "max_devices_per_job": 16,
             "weight": 1.0, "max_priority": "high"}


def demo_credentials() -> dict[str, str]:
    """The demo organization, its admin (platform staff) and an API token, made on the first run
    and remembered in ``PLEXRL_HOME/demo-credentials.json`` (readable by its owner only): a second
    run signs in with the same ones."""
    import json
    import secrets

    from django.conf import settings
    from django.db import transaction

    from accounts.models import Organization, Plan, User
    from accounts.services import organization_create, plan_assign, plan_create, token_create

    path = settings.PLEXRL_HOME / CREDENTIALS_FILE
    if path.exists():
        saved = json.loads(path.read_text())
        if User.objects.filter(username=saved["username"]).exists():
            return saved
    with transaction.atomic():
        password = secrets.token_urlsafe(12)
        user = User.objects.filter(username=DEMO_USER).first() or User(username=DEMO_USER)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        organization = (Organization.objects.filter(name=DEMO_ORGANIZATION).first()
                        or organization_create(name=DEMO_ORGANIZATION, owner=user))
        plan = Plan.objects.filter(name=DEMO_PLAN["name"]).first() or plan_create(actor=user, **DEMO_PLAN)
        plan_assign(organization=organization, plan=plan, actor=user)
        _, token = token_create(user=user, organization=organization, name="demo")
    saved = {"username": DEMO_USER, "password": password, "token": token, "organization": organization.name}
    path.touch(mode=0o600)
    path.write_text(json.dumps(saved, indent=2))
    return saved


def submit_demo_jobs(steps: int | None = None) -> list[int]:
    """The demo organization's jobs: the demo jobs, submitted on the first run only (a second run
    shows the same ones, finished or resumed by the engine's logs). ``steps``: at most this many
    steps a job (a quicker look; each job keeps its own count when that is fewer)."""
    from accounts.models import Organization, User
    from jobs import services
    from jobs.models import Job

    organization = Organization.objects.get(name=DEMO_ORGANIZATION)
    existing = list(Job.objects.filter(organization=organization).order_by("id").values_list("id", flat=True))
    if existing:
        return existing
    user = User.objects.get(username=DEMO_USER)
    specs = [{**job["spec"], "steps": min(job["spec"]["steps"], steps or job["spec"]["steps"])} for job in DEMO_JOBS]
    return [services.job_create(organization=organization, user=user, spec=spec, name=job["name"]).pk
            for job, spec in zip(DEMO_JOBS, specs, strict=True)]


def build_missing_presets(names: set[str]) -> None:
    """Build the model presets the demo needs that ``PLEXRL_HOME`` lacks (once; a few minutes), side
    by side (``engine.models.build_presets``)."""
    from engine.control import build_presets

    missing = missing_presets(names)
    if missing:
        print(f"PlexRL: building model presets {', '.join(map(repr, missing))} (first run only)…", flush=True)
        build_presets(missing, progress=True)


class DemoProgress(threading.Thread):
    """Shows the demo jobs' progress in the terminal until ``stop`` is set: a bar per job (step,
    reward, state) on a terminal, a line per job whose step or state changed (every 15 s at most)
    in a log. With ``exit_when_done``, stops the server once every job has ended and its log is
    fully ingested (``failed`` then says whether one did not succeed)."""

    def __init__(self, job_ids: list[int], *, exit_when_done: bool, every_s: float = 2.0):
        super().__init__(name="demo-progress", daemon=True)
        self.job_ids, self.exit_when_done, self.every_s = job_ids, exit_when_done, every_s
        self.stop = threading.Event()
        self.failed: list[str] = []
        self.done = False

    def run(self) -> None:
        from django.db import close_old_connections
        from tqdm import tqdm

        from jobs.models import TERMINAL_STATES, Job, JobState

        bars: dict[int, tqdm] = {}
        shown: dict[int, tuple[int, str]] = {}
        tty, last_lines = sys.stdout.isatty(), 0.0
        try:
            while not self.stop.wait(self.every_s):
                close_old_connections()
                jobs = list(Job.objects.filter(pk__in=self.job_ids).order_by("id"))
                lines_due = time.monotonic() - last_lines >= 15
                for position, job in enumerate(jobs):
                    last = job.metrics.order_by("-step").values_list("step", "data").first()
                    step, data = last if last else (0, {})
                    status = f"{job.state}, reward {data.get('reward_mean', 0):.2f}"
                    if tty:
                        bar = bars.get(job.pk)
                        if bar is None:
                            bar = bars[job.pk] = tqdm(total=job.spec["steps"], position=position, unit="step",
                                                      desc=f"#{job.pk} {job.name[:24]:<24}", leave=True)
                        bar.n = step
                        bar.set_postfix_str(status, refresh=True)
                    elif lines_due and shown.get(job.pk) != (step, job.state):
                        shown[job.pk] = (step, job.state)
                        last_lines = time.monotonic()
                        print(f"#{job.pk} {job.name}: step {step}/{job.spec['steps']}, {status}", flush=True)
                if self.exit_when_done and jobs and all(j.state in TERMINAL_STATES and j.events_complete
                                                        for j in jobs):
                    self.failed = [f"#{j.pk} {j.name}: {j.state} {j.state_reason}".strip()
                                   for j in jobs if j.state != JobState.SUCCEEDED]
                    self.done = True
                    EmbeddedPlatform.stop()
                    return
        finally:
            for bar in bars.values():
                bar.close()


def demo(*, host: str, port: int, open_browser: bool, exit_after_jobs: bool, steps: int | None = None) -> int:
    """``plexrl demo``: ``plexrl up`` plus a demo organization, its admin and the demo jobs, with
    their progress in the terminal. ``exit_after_jobs``: stop once the demo jobs have ended; 0 if
    they all succeeded, 1 otherwise. ``steps``: see ``submit_demo_jobs``."""
    setup_django()
    from django.conf import settings

    build_missing_presets({job["spec"]["model"] for job in DEMO_JOBS})
    platform = EmbeddedPlatform(host=host, port=port)
    print(f"PlexRL demo: data in {settings.PLEXRL_HOME}; starting the engine and the worker…", flush=True)
    progress = None
    try:
        platform.start()
        credentials = demo_credentials()
        job_ids = submit_demo_jobs(steps)
        progress = DemoProgress(job_ids, exit_when_done=exit_after_jobs)

        def ready() -> None:
            print(f"\nPlexRL is up: {platform.url}/accounts/login/\n"
                  f"  sign in as {credentials['username']} / {credentials['password']}\n"
                  f"  API token: {credentials['token']}\n"
                  f"  (also in {settings.PLEXRL_HOME / CREDENTIALS_FILE}; Ctrl-C stops everything)\n", flush=True)
            progress.start()
            if open_browser:
                import webbrowser

                webbrowser.open(f"{platform.url}/accounts/login/")

        platform.when_ready(ready)
        platform.serve()
    finally:
        if progress is not None:
            progress.stop.set()
        print("PlexRL: stopping…", flush=True)
        platform.close()
    print("PlexRL: stopped.", flush=True)
    if exit_after_jobs:
        if not progress.done:
            print("plexrl: error: stopped before the demo jobs ended", file=sys.stderr)
            return 1
        for line in progress.failed:
            print(f"plexrl: error: demo job did not succeed: {line}", file=sys.stderr)
        return 1 if progress.failed else 0
    return 0
