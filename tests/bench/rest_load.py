"""REST under a fixed request rate (open loop): a mix of authenticated API reads through the
production web server, for issue 10's goal of 200 requests/s for 60 s with no 5xx and p99 < 500 ms.

    .venv/bin/python tests/bench/rest_load.py [--rate 200] [--seconds 60] [--jobs 200] [--json]

Sets up a PostgreSQL database of its own (``plexrl_bench_load``, dropped and recreated, and dropped
again at the end) holding one organization with ``--jobs`` jobs (metrics, events and usage rows of
20 steps each) and a token, and starts the web server as production runs it (``rest_setup``).
Then it sends requests at ``--rate`` per second whatever the answers do: request i is due at
``i / rate`` seconds and is handed to a pool of ``--connections`` threads, each with its own
keep-alive connection. Latency runs from when a request was due, so time spent queued behind a
slow server (in the pool or in the server) counts; a client that waited for each answer before
sending the next would hide it (coordinated omission).

Prints the achieved rate, status-code counts (5xx explicitly) and p50/p90/p99/max latency overall
and per endpoint; ``--json`` prints the same as JSON. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rest_setup import (
    WEB_SERVER,
    Fixture,
    WebServer,
    bench_env,
    create_database,
    drop_database,
    postgres_cpu_seconds,
    web_server,
)

DB = "plexrl_bench_load"


@dataclass(frozen=True)
class Endpoint:
    """One kind of request of the mix: its share of the requests and how to draw a path."""

    name: str
    weight: float
    path: Callable[[random.Random, list[int]], str]


# What a dashboard and CLI user reads, by weight: lists and job pages most, billing reports less.
MIX = (
    Endpoint("jobs list", 20, lambda rng, ids: "/api/v1/jobs/"),
    Endpoint("jobs list ?state", 5, lambda rng, ids: "/api/v1/jobs/?state=running&page_size=20"),
    Endpoint("job detail", 20, lambda rng, ids: f"/api/v1/jobs/{rng.choice(ids)}/"),
    Endpoint("job metrics", 20, lambda rng, ids: f"/api/v1/jobs/{rng.choice(ids)}/metrics/"),
    Endpoint("job events", 10, lambda rng, ids: f"/api/v1/jobs/{rng.choice(ids)}/events/"),
    Endpoint("billing usage", 10, lambda rng, ids: f"/api/v1/billing/usage/?job={rng.choice(ids)}"),
    Endpoint("billing summary", 5, lambda rng, ids: "/api/v1/billing/summary/?month=2023-11"),
    Endpoint("quota", 5, lambda rng, ids: "/api/v1/quota/"),
    Endpoint("billing savings", 5, lambda rng, ids: "/api/v1/billing/savings/"),
)


@dataclass(frozen=True)
class Sample:
    endpoint: str
    status: str  # the HTTP status code, "timeout" (no answer within --timeout of its due time) or "error"
    latency_s: float  # from when the request was due until its answer was read
    done_at: float  # time.perf_counter() at the answer


class Client:
    """Keep-alive GETs with the token, one connection per pool thread (reopened after an error)."""

    def __init__(self, base_url: str, token: str, timeout: float):
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname, parts.port
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.timeout = timeout
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return conn

    def get(self, path: str, due: float) -> str:
        """GET ``path``, due at ``due`` (``time.perf_counter()``); its status code as a string,
        "timeout" when no answer came within ``timeout`` of ``due`` (then it is not even sent if
        that time has passed while it queued in the pool), or "error" (the connection failed).

        A kept-alive connection the server has closed meanwhile (after its idle timeout) fails
        before any answer: the request is then sent again on a new one, as HTTP clients do."""
        for attempt in (1, 2):
            left = due + self.timeout - time.perf_counter()
            if left <= 0:
                return "timeout"
            conn = self._connection()
            reused = conn.sock is not None
            try:
                if reused:
                    conn.sock.settimeout(left)
                else:
                    conn.timeout = left
                conn.request("GET", path, headers=self.headers)
                response = conn.getresponse()
                response.read()
                if response.will_close:
                    self._drop(conn)
                return str(response.status)
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if isinstance(exc, TimeoutError):
                    return "timeout"
                stale = isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError)
                if not (reused and stale and attempt == 1):
                    return "error"
        return "error"

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None


def run_load(client: Client, ids: list[int], *, rate: float, seconds: float, connections: int,
             seed: int = 0) -> tuple[list[Sample], float]:
    """Send ``rate * seconds`` requests of ``MIX``, request i due at ``i / rate``; returns the
    samples and the largest delay of a send behind its due time (the generator's own lag)."""
    rng = random.Random(seed)
    weights = [e.weight for e in MIX]
    count = math.floor(rate * seconds)
    plan = [(e.name, e.path(rng, ids)) for e in rng.choices(MIX, weights=weights, k=count)]
    samples: list[Sample] = []
    lock = threading.Lock()

    def send(name: str, path: str, due: float) -> None:
        status = client.get(path, due)
        done = time.perf_counter()
        with lock:
            samples.append(Sample(name, status, done - due, done))

    lag = 0.0
    with ThreadPoolExecutor(max_workers=connections, thread_name_prefix="load") as pool:
        start = time.perf_counter() + 0.1
        for i, (name, path) in enumerate(plan):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                lag = max(lag, -wait)
            pool.submit(send, name, path, due)
    return samples, lag


def cpu_seconds(server: WebServer) -> dict[str, float]:
    """CPU time so far of the web server, PostgreSQL and this process (the load generator)."""
    return {"server": server.cpu_seconds(), "postgres": postgres_cpu_seconds(), "generator": time.process_time()}


def warm_up(client: Client, ids: list[int], *, rounds: int) -> None:
    """Each endpoint of the mix ``rounds`` times, one at a time: lazy imports and first queries
    happen before the measurement, not in it."""
    rng = random.Random(1)
    for _ in range(rounds):
        for endpoint in MIX:
            client.get(endpoint.path(rng, ids), time.perf_counter())


def _percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (NaN when empty)."""
    if not sorted_xs:
        return math.nan
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q / 100 * len(sorted_xs)) - 1))]


def _stats(samples: list[Sample]) -> dict[str, Any]:
    latencies = sorted(s.latency_s for s in samples)
    statuses = Counter(s.status for s in samples)
    return {
        "count": len(samples),
        "status": dict(sorted(statuses.items())),
        "5xx": sum(n for code, n in statuses.items() if code.startswith("5")),
        "errors": statuses.get("error", 0),
        "timeouts": statuses.get("timeout", 0),
        **{f"p{q}_ms": round(1000 * _percentile(latencies, q), 1) for q in (50, 90, 99)},
        "max_ms": round(1000 * latencies[-1], 1) if latencies else math.nan,
    }


def summarize(samples: list[Sample], *, rate: float, seconds: float, lag: float, jobs: int,
              cpu_s: dict[str, float]) -> dict[str, Any]:
    """The result: overall and per-endpoint statistics, the rate the server kept up with (answers,
    of any status, per second from the first due time to the last answer) and the web server's
    CPU time per answer (its processes' user + system time over the run: unlike latency, it hardly
    depends on what else the machine runs), and the same for PostgreSQL and this load generator:
    together, where the machine's cores went."""
    answered = [s for s in samples if s.status.isdigit()]
    span = max(s.done_at for s in answered) - min(s.done_at - s.latency_s for s in samples) if answered else 0.0
    return {
        "target_rate": rate, "seconds": seconds, "jobs": jobs,
        "achieved_rate": round(len(answered) / span, 1) if span > 0 else 0.0,
        "generator_max_lag_ms": round(1000 * lag, 1),
        **{f"{who}_cpu_ms_per_answer": round(1000 * seconds / len(answered), 2) if answered else math.nan
           for who, seconds in cpu_s.items()},
        "server": f"{WEB_SERVER}, DEBUG off, PostgreSQL",
        "overall": _stats(samples),
        "endpoints": {e.name: _stats([s for s in samples if s.endpoint == e.name]) for e in MIX},
    }


def print_table(result: dict[str, Any]) -> None:
    head = f"{'endpoint':<18}{'count':>7}{'2xx':>7}{'4xx':>6}{'5xx':>6}{'t/o':>6}{'err':>6}" \
           f"{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    print(head)
    rows = [*result["endpoints"].items(), ("all", result["overall"])]
    for name, r in rows:
        ok = sum(n for code, n in r["status"].items() if code.startswith("2"))
        client_errors = sum(n for code, n in r["status"].items() if code.startswith("4"))
        if name == "all":
            print("-" * len(head))
        print(f"{name:<18}{r['count']:>7}{ok:>7}{client_errors:>6}{r['5xx']:>6}{r['timeouts']:>6}{r['errors']:>6}"
              f"{r['p50_ms']:>9}{r['p90_ms']:>9}{r['p99_ms']:>9}{r['max_ms']:>9}")
    o = result["overall"]
    print(f"target {result['target_rate']:g}/s for {result['seconds']:g} s: achieved {result['achieved_rate']}/s; "
          f"{o['5xx']} 5xx, {o['timeouts']} timeouts, {o['errors']} connection errors; status {o['status']}; "
          f"generator lag max {result['generator_max_lag_ms']} ms")
    print(f"CPU per answer: server {result['server_cpu_ms_per_answer']} ms, PostgreSQL "
          f"{result['postgres_cpu_ms_per_answer']} ms, load generator {result['generator_cpu_ms_per_answer']} ms; "
          f"{result['server']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to send (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=200, help="jobs in the organization (default: %(default)s)")
    parser.add_argument("--connections", type=int, default=256,
                        help="most requests in flight: client threads, one connection each (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds from its due time before a request counts as a timeout (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="rounds of the mix sent one request at a time first, not counted (default: %(default)s)")
    parser.add_argument("--server-log", type=Path, help="write the web server's output to this file")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    args = parser.parse_args()
    env = bench_env(DB)
    try:
        fixture: Fixture = create_database(DB, env, jobs=args.jobs)
        with web_server(env, log=args.server_log) as server:
            client = Client(server.url, fixture.token, args.timeout)
            warm_up(client, fixture.job_ids, rounds=args.warmup)
            before = cpu_seconds(server)
            samples, lag = run_load(client, fixture.job_ids, rate=args.rate, seconds=args.seconds,
                                    connections=args.connections)
            used = {who: seconds - before[who] for who, seconds in cpu_seconds(server).items()}
    finally:
        drop_database(DB)
    result = summarize(samples, rate=args.rate, seconds=args.seconds, lag=lag, jobs=args.jobs, cpu_s=used)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
