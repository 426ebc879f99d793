"""``plexrl bench remote``: what a call costs through the SDK over HTTP, beyond what it costs in the
engine, and how many calls a second one session makes with and without pipelining.

It starts the platform as ``plexrl up`` does (daphne, Celery and the engine on a local Ray, in a
data directory of its own; the models are the current data directory's), makes an organization
and a token with ``manage.py``, opens a session through the SDK on loopback (or, with ``--url``
and a token, one on a platform already running, as deployed), and times:

- ``forward`` on a fixed batch, one call at a time: for each call the SDK's round trip and the
  engine's own part of it (``engine_ms`` of the answer: the call's turn in the session driver to
  its result, what the same call costs a job's driver inside the engine). The overhead of the
  SDK path is their difference, call by call (HTTP, the web server, the JSON both ways, the Ray
  hop to the session's driver).
- the same calls with ``--pipeline`` of them in flight (``forward_async``): calls per second.

Nothing is asserted; the result is a table or, with ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from engine.bench.harness import percentiles, print_rows
from engine.paths import REPO_ROOT, models_dir

START_TIMEOUT_S = 240.0


def add_parser(bsub: argparse._SubParsersAction) -> None:
    r = bsub.add_parser("remote", help="a session call's overhead through the SDK over HTTP, and pipelined calls/s")
    r.add_argument("--json", action="store_true")
    r.add_argument("--calls", type=int, default=200, help="sequential forward calls timed (default 200)")
    r.add_argument("--pipeline", type=int, default=16, help="calls in flight in the pipelined run (default 16)")
    r.add_argument("--rows", type=int, default=8, help="rows of each forward call's batch (default 8)")
    r.add_argument("--model", default="tiny-arith")
    r.add_argument("--url", help="measure the platform running there instead of starting one (as deployed: "
                                 "its web server, database and cluster)")
    r.add_argument("--token", help="with --url: an API token of a member (default: $PLEXRL_TOKEN)")
    r.set_defaults(func=cmd_bench_remote)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _platform_env(home: Path) -> dict[str, str]:
    """The embedded platform's environment (SQLite, in-process Celery, a local Ray) with DEBUG off,
    as an operator would serve it, in data directory ``home``."""
    drop = ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {"PLEXRL_HOME": str(home), "DJANGO_DEBUG": "false", "PYTHONPATH": str(REPO_ROOT)}


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


@contextlib.contextmanager
def live_platform(home: Path) -> Iterator[tuple[str, str]]:
    """``plexrl up`` on a free loopback port with data in ``home``; (its URL, an API token)."""
    env = _platform_env(home)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (home / "platform.log").open("w")
    server = subprocess.Popen([sys.executable, str(REPO_ROOT / "plexrl.py"), "up", "--port", str(port),
                               "--no-browser"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"plexrl up exited with {server.returncode}; see {log.name}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=2):  # noqa: S310
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"plexrl up did not answer within {START_TIMEOUT_S:.0f} s; see {log.name}")
            time.sleep(0.5)
        _manage(env, "create_organization", "Bench", "--owner", "bench")
        yield url, _manage(env, "create_token", "bench", "--name", "bench")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def measure(session, calls: int, pipeline: int, rows: int) -> dict:
    """Time ``calls`` forward calls one at a time, then ``calls`` with ``pipeline`` in flight."""
    prompts = [[5, 6, 7, 8, 9, 10][: 3 + i % 4] for i in range(rows)]
    completions = [[11, 12, 13, 1] for _ in range(rows)]
    for _ in range(10):  # warm: the web server's threads, the driver, the worker group's kernels
        session.forward(prompts, completions)
    session.timings.clear()
    t = time.perf_counter()
    for _ in range(calls):
        session.forward(prompts, completions)
    sequential_s = time.perf_counter() - t
    timed = list(session.timings)
    t = time.perf_counter()
    in_flight: deque = deque()
    for _ in range(calls):
        if len(in_flight) >= pipeline:
            in_flight.popleft().result()
        in_flight.append(session.forward_async(prompts, completions))
    for future in in_flight:
        future.result()
    pipelined_s = time.perf_counter() - t
    round_trip = [c.seconds for c in timed]
    in_engine = [c.engine_seconds for c in timed]
    overhead = percentiles([c.seconds - c.engine_seconds for c in timed])
    sdk_call, in_engine_call = percentiles(round_trip), percentiles(in_engine)
    return {
        "remote_overhead_p50_ms": overhead["p50_ms"],
        "remote_overhead_p99_ms": overhead["p99_ms"],
        "sdk_call": sdk_call,
        "in_engine_call": in_engine_call,
        "overhead_pct_of_call_p50": 100.0 * overhead["p50_ms"] / sdk_call["p50_ms"],
        "calls_per_s_sequential": calls / sequential_s,
        "calls_per_s_pipelined": calls / pipelined_s,
        "in_engine_calls_per_s": 1e3 / in_engine_call["p50_ms"],
        "pipeline": pipeline,
        "calls": calls,
        "rows": rows,
        "call": "forward",
        "server": "plexrl up (daphne, SQLite, DEBUG off), SDK on loopback",
    }


def _measure_at(url: str, token: str, model: str, calls: int, pipeline: int, rows: int) -> dict:
    from plexrl_client import ServiceClient

    session = ServiceClient(url, token, timeout=120).create_session(model, rollout="torch", trainer="torch")
    try:
        return measure(session, calls, pipeline, rows)
    finally:
        session.close()


def bench_remote(calls: int, pipeline: int, rows: int, model: str, url: str | None = None,
                 token: str | None = None) -> dict:
    """On the platform at ``url`` (with ``token``), else on one started for the run."""
    from engine.models import resolve_model

    if url is not None:
        return _measure_at(url, token or "", model, calls, pipeline, rows) | {"server": url}
    resolve_model(model)  # built once in the current data directory; the bench's links to it
    with tempfile.TemporaryDirectory(prefix="plexrl-bench-remote-") as tmp:
        home = Path(tmp)
        (home / "models").symlink_to(models_dir())
        with live_platform(home) as (started, token):
            return _measure_at(started, token, model, calls, pipeline, rows)


def cmd_bench_remote(args: argparse.Namespace) -> int:
    from engine.errors import CliError

    for name in ("calls", "pipeline", "rows"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be at least 1")
    token = args.token or os.environ.get("PLEXRL_TOKEN")
    if args.url is not None and not token:
        raise CliError("--token: no API token (give --token or set PLEXRL_TOKEN)")
    result = bench_remote(args.calls, args.pipeline, args.rows, args.model, args.url, token)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print_rows([
        ("SDK call p50 / p99", f"{result['sdk_call']['p50_ms']:.2f} / {result['sdk_call']['p99_ms']:.2f} ms"),
        ("in the engine p50 / p99",
         f"{result['in_engine_call']['p50_ms']:.2f} / {result['in_engine_call']['p99_ms']:.2f} ms"),
        ("overhead p50 / p99",
         f"{result['remote_overhead_p50_ms']:.2f} / {result['remote_overhead_p99_ms']:.2f} ms"),
        ("calls/s, one at a time", f"{result['calls_per_s_sequential']:.1f}"),
        (f"calls/s, {result['pipeline']} in flight", f"{result['calls_per_s_pipelined']:.1f}"),
    ])
    print(f"({result['calls']} {result['call']} calls of {result['rows']} rows each; {result['server']})")
    return 0
