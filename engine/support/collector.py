"""Python's cyclic garbage collector, paused around work that allocates objects by the million."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off while the block runs (reference counting still frees what it can;
    cycles wait for the next collection), back on after it if it was on.

    Callers: a wide vLLM generate call (requests, KV block lists and outputs: the collections they
    trigger rescan everything alive in the engine, about a sixth of a call's time), and a simulator
    mode (millions of calls and usage records, all kept to the end: each full collection rescans
    them all)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
