"""Websocket fan-out: how long a committed metrics point takes to reach every client of a job.

    .venv/bin/python tests/bench/ws_fanout.py [--clients 200] [--points 50] [--interval 0.05]
        [--database-url postgres://...] [--redis-url redis://...] [--json]

Without ``--database-url`` it uses a PostgreSQL database of its own (``plexrl_bench_ws``, dropped,
recreated and migrated). It creates an organization, a user, a token and a running job, starts
``daphne config.asgi:application`` on a free port (one process, DEBUG off), and opens
``--clients`` websocket clients on ``/ws/jobs/<id>/`` (the ``websockets`` library, the token in
the ``Authorization`` header). Once every client has its snapshot (so it is in the job's group), it
ingests ``--points`` metrics events one at a time through ``jobs.ingest.ingest_events`` in this
process, ``--interval`` seconds apart, and stamps each with its commit time (an ``on_commit`` hook
registered before the service's own push). Each client stamps each message when it arrives.

Prints, per point and client, the receive lag (receive time - commit time; one clock, one
machine): p50 / p99 / max, and messages delivered / expected, as a table and as JSON. A benchmark:
it asserts nothing about timings.

The channel layer is Redis database 13 unless ``--redis-url`` (or REDIS_URL) says otherwise, away
from the test suite's database 15.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DB = "plexrl_bench_ws"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _django(env: dict[str, str], *, fresh_database: bool) -> None:
    """Set Django up in this process against the benchmark's database (created and migrated when
    it is the throwaway one)."""
    if fresh_database:
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", f"DROP DATABASE IF EXISTS {DB}",
                        "-c", f"CREATE DATABASE {DB}"], check=True, capture_output=True)
    os.environ.update(env)
    sys.path[:0] = [str(REPO / "platform"), str(REPO)]
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _fixtures() -> tuple[object, str]:
    """A fresh organization, user, token and running job; returns (job, token)."""
    import uuid

    from accounts.models import User
    from accounts.services import organization_create, token_create
    from engine.spec import JobSpec
    from jobs.models import Job

    name = f"bench-{uuid.uuid4().hex[:8]}"
    user = User.objects.create_user(name, password=uuid.uuid4().hex)
    organization = organization_create(name=name, owner=user)
    _, token = token_create(user=user, organization=organization, name="bench")
    spec = JobSpec(task="arith", model="tiny-arith", steps=10_000, rollout="torch", trainer="torch").to_dict()
    job = Job.objects.create(organization=organization, created_by=user, name=name, spec=spec, state="running")
    return job, token


class Clients:
    """``n`` websocket clients on one job, in an asyncio loop on a thread of their own; each records
    ``(seq, receive time)`` of every metrics message."""

    def __init__(self, url: str, token: str, n: int):
        self.url, self.token, self.n = url, token, n
        self.received: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.ready = threading.Event()
        self.failed: list[str] = []
        self.connect_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    async def _main(self) -> None:
        import websockets

        self._stop = asyncio.Event()
        gate = asyncio.Semaphore(50)  # connections being opened at once
        connections: list = [None] * self.n
        started = time.perf_counter()

        async def open_one(i: int) -> None:
            async with gate:
                try:
                    headers = {"Authorization": f"Bearer {self.token}"}
                    ws = await websockets.connect(self.url, additional_headers=headers, max_queue=None,
                                                  open_timeout=60)
                    snapshot = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
                    assert snapshot["type"] == "job", snapshot
                    connections[i] = ws
                except Exception as exc:  # a benchmark reports failures, it does not stop on them
                    self.failed.append(f"client {i}: {exc!r}")

        await asyncio.gather(*(open_one(i) for i in range(self.n)))
        self.connect_s = time.perf_counter() - started
        self.ready.set()

        async def listen(i: int, ws) -> None:
            try:
                async for raw in ws:
                    at = time.time()
                    message = json.loads(raw)
                    if message["type"] == "metrics":
                        self.received[i].append((message["seq"], at))
            except Exception as exc:
                self.failed.append(f"client {i}: {exc!r}")

        listeners = [asyncio.ensure_future(listen(i, ws)) for i, ws in enumerate(connections) if ws is not None]
        await self._stop.wait()
        await asyncio.gather(*(ws.close() for ws in connections if ws is not None), return_exceptions=True)
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)

    def delivered(self) -> int:
        return sum(len(r) for r in self.received)


def _ingest(job, points: int, interval: float) -> dict[int, float]:
    """Ingest ``points`` metrics events one by one; returns {seq: commit time}."""
    from django.db import transaction

    from jobs.ingest import ingest_events

    committed: dict[int, float] = {}
    for seq in range(1, points + 1):
        event = {"seq": seq, "kind": "metrics", "ts": time.time(), "data": {"step": seq, "reward_mean": 0.5}}
        with transaction.atomic():
            # runs first among the on_commit hooks, right after COMMIT and before the live push
            transaction.on_commit(lambda seq=seq: committed.__setitem__(seq, time.time()))
            ingest_events(job=job, events=[event])
        time.sleep(interval)
    return committed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between two ingests")
    parser.add_argument("--database-url", help=f"default: a throwaway database {DB} (dropped and recreated)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--drain", type=float, default=10.0, help="seconds to wait for the last messages")
    parser.add_argument("--server-log", help="write daphne's output to this file")
    parser.add_argument("--json", action="store_true", help="print only the JSON")
    args = parser.parse_args()
    env = {"DATABASE_URL": args.database_url or f"postgres://postgres@127.0.0.1:5432/{DB}",
           "REDIS_URL": args.redis_url, "PLEXRL_ENV": "development", "DJANGO_DEBUG": "false",
           "DJANGO_SETTINGS_MODULE": "config.settings"}
    _django(env, fresh_database=args.database_url is None)
    job, token = _fixtures()

    port = _free_port()
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "config.asgi:application"], cwd=REPO / "platform",
                              env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                              stdout=log, stderr=log)
    clients = Clients(f"ws://127.0.0.1:{port}/ws/jobs/{job.pk}/", token, args.clients)
    try:
        for _ in range(150):  # wait for the server
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        clients.start()
        clients.ready.wait(timeout=300)
        connected = args.clients - len(clients.failed)
        started = time.perf_counter()
        committed = _ingest(job, args.points, args.interval)
        ingest_s = time.perf_counter() - started
        expected = connected * args.points
        deadline = time.monotonic() + args.drain
        while clients.delivered() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        clients.stop()
        server.terminate()
        server.wait(timeout=10)
        if log is not subprocess.DEVNULL:
            log.close()

    lags = [at - committed[seq] for received in clients.received for seq, at in received if seq in committed]
    per_client = [sorted(seq for seq, _ in received) for received in clients.received if received]
    duplicates = sum(len(seqs) - len(set(seqs)) for seqs in per_client)

    def ms(q: float) -> float:
        if not lags:
            return float("nan")
        return round(1000 * (statistics.quantiles(lags, n=100)[q - 1] if len(lags) >= 2 else lags[0]), 1)

    result = {
        "clients": args.clients, "connected": connected, "points": args.points, "interval_s": args.interval,
        "connect_s": round(clients.connect_s, 2), "ingest_s": round(ingest_s, 2),
        "expected": expected, "delivered": clients.delivered(), "duplicates": duplicates,
        "lag_p50_ms": ms(50), "lag_p99_ms": ms(99), "lag_max_ms": round(1000 * max(lags), 1) if lags else None,
        "errors": clients.failed[:5], "server": "daphne (one process), DEBUG off, PostgreSQL, channels-redis",
    }
    if not args.json:
        print(f"{'clients':>8}{'points':>8}{'delivered':>12}{'expected':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
        print(f"{connected:>8}{args.points:>8}{result['delivered']:>12}{expected:>10}"
              f"{result['lag_p50_ms']:>9}{result['lag_p99_ms']:>9}{result['lag_max_ms']:>9}")
        print(f"connected {connected} clients in {result['connect_s']} s; {duplicates} duplicates; "
              f"{len(clients.failed)} client errors")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
