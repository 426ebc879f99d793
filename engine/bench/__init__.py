"""Engine benchmarks (``plexrl bench ...``): each prints a table or JSON and asserts nothing about
timings. One module a benchmark, each with a measure part (returns a dict) and a report part."""

from __future__ import annotations

import argparse


def add_bench(sub: argparse._SubParsersAction) -> None:
    """Register ``plexrl bench`` and its benchmarks (called by ``engine.cli``)."""
    from engine.bench import backend_speed, cluster_bench, engine_calls, mux, remote, state_swaps

    p = sub.add_parser("bench", help="benchmarks (print, never assert)")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    for bench in (engine_calls, backend_speed, state_swaps, mux, cluster_bench, remote):
        bench.add_parser(bsub)
