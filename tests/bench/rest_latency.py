"""REST latency under concurrent clients: job list and job detail, through a real ASGI server.

    .venv/bin/python tests/bench/rest_latency.py [--clients 20] [--seconds 20] [--jobs 200] [--json]

Sets up a PostgreSQL database of its own (``plexrl_bench_rest``, dropped and recreated), one
organization with ``--jobs`` jobs (each with 20 steps of metrics, events and usage), a token,
starts the production web server on a free port (``rest_setup``), and runs ``--clients`` threads
that alternate
``GET /api/v1/jobs/`` and ``GET /api/v1/jobs/<id>/`` for ``--seconds``. Prints p50 / p99 per
endpoint and requests per second. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.request

from rest_setup import WEB_SERVER, bench_env, create_database, web_server

DB = "plexrl_bench_rest"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = bench_env(DB)
    fixture = create_database(DB, env, jobs=args.jobs)
    token, ids = fixture.token, fixture.job_ids
    headers = {"Authorization": f"Bearer {token}"}
    with web_server(env) as server:
        base = f"{server.url}/api/v1"
        latencies: dict[str, list[float]] = {"list": [], "detail": []}
        errors = [0]
        lock = threading.Lock()
        stop = time.monotonic() + args.seconds

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop:
                for kind in ("list", "detail"):
                    url = f"{base}/jobs/" if kind == "list" else f"{base}/jobs/{rng.choice(ids)}/"
                    t0 = time.perf_counter()
                    try:
                        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:  # noqa: S310 - http://127.0.0.1 only
                            r.read()
                            ok = r.status == 200
                    except OSError:
                        ok = False
                    dt = time.perf_counter() - t0
                    with lock:
                        if ok:
                            latencies[kind].append(dt)
                        else:
                            errors[0] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started

    def pct(xs: list[float], q: float) -> float:
        return 1000 * statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else float("nan")

    result = {
        "clients": args.clients, "seconds": round(wall, 1), "jobs": args.jobs, "errors": errors[0],
        **{kind: {"requests": len(xs), "p50_ms": round(pct(xs, 50), 1), "p99_ms": round(pct(xs, 99), 1)}
           for kind, xs in latencies.items()},
        "requests_per_s": round(sum(len(x) for x in latencies.values()) / wall, 1),
        "server": f"{WEB_SERVER}, DEBUG off, PostgreSQL",
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{'endpoint':<10}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}")
        for kind in ("list", "detail"):
            r = result[kind]
            print(f"{kind:<10}{r['requests']:>10}{r['p50_ms']:>10}{r['p99_ms']:>10}")
        print(f"{result['requests_per_s']} requests/s with {args.clients} clients; {errors[0]} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
