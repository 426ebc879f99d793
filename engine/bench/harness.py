"""What every engine benchmark shares: timed calls, medians and percentiles, a training batch, and
the two-column table a report prints."""

from __future__ import annotations

import time

import numpy as np


def percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def train_batch(tok, problems, size: int):
    """``size`` training rows cycling over ``problems`` (answer + EOS as completions), advantages
    spread over [-1, 1] so a GRPO loss has gradients."""
    import torch

    from engine.api import Batch

    prompts = [tok.encode(p.prompt) for p in problems]
    completions = [[*tok.encode(p.answer), tok.eos_token_id] for p in problems]
    return Batch(prompts=[prompts[i % len(prompts)] for i in range(size)],
                 completions=[completions[i % len(completions)] for i in range(size)],
                 advantages=torch.linspace(-1, 1, size))


def print_rows(rows: list[tuple[str, str]]) -> None:
    """A two-column table: names left-aligned, values right-aligned."""
    name_w = max(28, *(len(n) + 2 for n, _ in rows))
    value_w = max(28, *(len(v) for _, v in rows))
    for name, value in rows:
        print(f"{name:<{name_w}}{value:>{value_w}}")


def time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls after a warm-up call, and the warm-up's result (every
    call gets the same inputs)."""
    result = fn()
    return float(np.median(time_calls(fn, repeats))), result
