"""The platform's own processes, really started, for tests that need them: a Celery worker (with
its beat, when asked) and the ASGI server (daphne), on the test database and Redis, with a data
directory holding a built tiny model. Each process runs in a session of its own, so stopping it
stops everything it started (a local Ray included), and its output goes to a log the failure
message quotes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def build_engine_home(home: Path) -> Path:
    """``home`` with the tiny-arith preset built (a short supervised phase: plumbing, not skill)."""
    from engine.models.presets import TINY_ARITH
    from engine.models.tiny import build_preset

    build_preset(dataclasses.replace(TINY_ARITH, sft_steps=150, eval_size=20, threads=1),
                 home / "models" / TINY_ARITH.name)
    return home


def platform_env(home: Path) -> dict[str, str]:
    """The environment of a platform process on the test database (the one pytest-django made)."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DJANGO_SETTINGS_MODULE")}
    env |= {"DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "REDIS_URL": settings.REDIS_URL, "PLEXRL_HOME": str(home), "PYTHONPATH": str(REPO)}
    return env


class Process(subprocess.Popen):
    """A started platform process; ``log`` is its output file, ``tail()`` its last lines."""

    log: Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def check_alive(self) -> None:
        if self.poll() is not None:
            pytest.fail(f"{self.args[2:4]} exited ({self.returncode}); its log ends:\n{self.tail()}")

    def kill_group(self) -> None:
        """SIGKILL to its whole process group (the session it leads): nothing of it survives."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.wait()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to its whole session, SIGKILL after ``timeout``."""
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.wait()


def start(argv: list[str], *, env: dict[str, str], log: Path) -> Process:
    with log.open("w") as out:
        proc = Process(argv, cwd=REPO / "platform", env=env, start_new_session=True, stdout=out,
                       stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def celery_worker(env: dict[str, str], log_dir: Path, *, beat: bool = False) -> Process:
    """``celery -A config worker`` (solo pool); with ``beat``, the periodic event pull runs too."""
    argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "--loglevel=INFO"]
    if beat:
        argv += ["--beat", f"--schedule={log_dir / 'celerybeat-schedule'}"]
    return start(argv, env=env, log=log_dir / "worker.log")


@contextlib.contextmanager
def ray_cluster(env: dict[str, str], log_dir: Path, *, devices: int = 2) -> Iterator[str]:
    """A Ray head node (``ray start --head --block``) in a session of its own, as a production
    deployment runs one; yields its address. Its files go to a temp dir of its own (short: Ray's
    socket paths must fit in 107 bytes), so the "last cluster" address ``ray start`` records is not
    left in /tmp/ray for every later ``ray.init()``; stopping it stops its daemons and workers,
    and no other Ray on the machine (``ray stop`` would stop them all)."""
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "disabled"}
    with (log_dir / "ray-head.log").open("w") as out:
        head = Process([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
                        f"--temp-dir={ray_tmp}", "--num-cpus=2", f'--resources={{"device": {devices}}}',
                        "--include-dashboard=false", "--disable-usage-stats"],
                       env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    head.log = log_dir / "ray-head.log"
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # Every process of the cluster (GCS, raylet, workers) runs in the head's session and process
        # group, so one SIGKILL ends them all at once; a SIGTERM makes ``ray start --block`` wind
        # them down gracefully, which takes some 34 s of every test that starts a cluster.
        head.kill_group()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def asgi_server(env: dict[str, str], log_dir: Path, timeout: float = 60) -> tuple[Process, str]:
    """daphne serving ``config.asgi:application``; returns it and its base URL once /healthz answers."""
    port = free_port()
    proc = start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                 env=env, log=log_dir / "daphne.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(url), timeout, f"daphne did not answer on {url}", [proc])
    return proc, url


def healthy(url: str) -> bool:
    """Whether the platform at ``url`` answers its liveness check (``/healthz``)."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:  # noqa: S310 (an http URL built above)
            return response.status == 200
    except OSError:
        return False


def leftovers(env: dict[str, str], grace: float = 10) -> list[str]:
    """Processes still running with this environment's data directory (a platform process, or a
    Ray daemon or worker one of them started), after up to ``grace`` seconds for them to exit."""
    import psutil

    deadline = time.monotonic() + grace
    while True:
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if proc.pid != os.getpid() and proc.environ().get("PLEXRL_HOME") == env["PLEXRL_HOME"]:
                    found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:160]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, procs: list[Process],
               poll: Callable[[], object] | None = None, every: float = 0.5) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` (with the processes' logs) on timeout or
    as soon as one of ``procs`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc in procs:
            proc.check_alive()
        if poll is not None:
            poll()
        time.sleep(every)
    logs = "\n".join(f"--- {p.log.name}:\n{p.tail()}" for p in procs)
    pytest.fail(f"{what} within {timeout} s\n{logs}")


@dataclass
class LivePlatform:
    url: str
    processes: list[Process]

    def wait_until(self, predicate, timeout: float, what: str) -> None:
        wait_until(predicate, timeout, what, self.processes)


@contextlib.contextmanager
def running_platform(engine_home: Path, log_dir: Path, *, devices: int = 2) -> Iterator[LivePlatform]:
    """The platform as production runs it, in separate processes: a Ray cluster of ``devices``
    device slots with the engine service on it (``plexrl engine start``), a Celery worker with its
    beat and daphne joining it through RAY_ADDRESS, on the test database and Redis. Afterwards, none
    of them (nor any Ray process) is left running."""
    import redis
    from django.conf import settings

    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()
    env = platform_env(engine_home)
    with ray_cluster(env, log_dir, devices=devices) as address:
        env["RAY_ADDRESS"] = address
        started = subprocess.run([sys.executable, "-m", "plexrl", "engine", "start"], env=env, capture_output=True,
                                 text=True, timeout=180)
        assert started.returncode == 0, started.stderr[-3000:]
        worker = celery_worker(env, log_dir, beat=True)
        server, url = asgi_server(env, log_dir)
        yield LivePlatform(url=url, processes=[server, worker])
        server.stop()
        worker.stop()
    broker.flushdb()
    left = leftovers(env)
    assert not left, f"processes left running: {left}"
