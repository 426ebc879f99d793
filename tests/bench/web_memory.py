"""Resident memory of the production web server at start: each uvicorn worker process after it
has answered its first requests (``/healthz`` and an API read), and whether it loaded torch, Ray or
vLLM (the control plane should load none of them: docs/architecture.md §2).

    .venv/bin/python tests/bench/web_memory.py [--json]

Uses the REST benchmarks' database and server set-up (``rest_setup``). A benchmark: it asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request

from rest_setup import WEB_SERVER, bench_env, create_database, drop_database, web_server

DB = "plexrl_bench_web_memory"
HEAVY = ("torch", "ray", "vllm")


def _workers_rss(process) -> list[dict]:
    """Each worker process's resident MB and which heavy packages its memory maps show."""
    import psutil

    rows = []
    for proc in psutil.Process(process.pid).children(recursive=True):
        if "resource_tracker" in " ".join(proc.cmdline()):
            continue  # multiprocessing's helper, not a worker
        maps = " ".join(m.path for m in proc.memory_maps())
        rows.append({"pid": proc.pid, "rss_mb": proc.memory_info().rss / 2**20,
                     "loaded": [name for name in HEAVY if f"/site-packages/{name}/" in maps]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    env = bench_env(DB)
    fixture = create_database(DB, env, jobs=5)
    try:
        with web_server(env) as server:
            request = urllib.request.Request(f"{server.url}/api/v1/jobs/",  # noqa: S310 - our own http server
                                             headers={"Authorization": f"Bearer {fixture.token}"})
            for _ in range(20):  # reach every worker process
                urllib.request.urlopen(request, timeout=30).read()  # noqa: S310 - our own http server
            time.sleep(1.0)
            workers = _workers_rss(server.process)
    finally:
        drop_database(DB)
    result = {"server": WEB_SERVER, "workers": workers,
              "median_worker_rss_mb": sorted(w["rss_mb"] for w in workers)[len(workers) // 2]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for w in workers:
            loaded = ", ".join(w["loaded"]) or "none of " + "/".join(HEAVY)
            print(f"worker {w['pid']}: {w['rss_mb']:.0f} MB resident, loaded: {loaded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
