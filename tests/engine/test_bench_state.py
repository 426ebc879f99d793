"""``plexrl bench state`` end to end: one small run prints every number with consistent values,
and bad input is one line with exit status 2. Benchmarks are never held to timings here."""

import json
import math

import pytest

from engine.bench.state_swaps import MB, STATE_BENCH_MEMORY_PER_BYTE, available_memory
from engine.state.store import default_host_budget

THROUGHPUTS = {"swap_in_gbps", "swap_out_gbps", "plain_copy_gbps", "plain_copy_out_gbps", "swap_in_vs_copy",
               "swap_out_vs_copy"}
SECONDS = {"swap_in_unprefetched_s", "swap_in_exposed_s", "switch_unprefetched_s", "switch_prefetched_s"}
FRACTIONS = {"prefetch_hidden_fraction", "switch_hidden_fraction"}
KEYS = THROUGHPUTS | SECONDS | FRACTIONS | {
    "dedup_jobs", "base_bytes", "host_bytes_without_dedup", "host_bytes_one_base_copy", "host_bytes_with_dedup",
    "state_bytes", "tensors", "repeats", "torch_threads", "device", "size_mb", "job_state_bytes",
    "prefetches_used", "forward_backward_s", "switched_call_s",
}


def test_bench_state_json_has_every_number(run_plexrl):
    result = run_plexrl("bench", "state", "--size-mb", "2", "--jobs", "2", "--repeats", "1", "--json", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads(result.stdout)
    assert set(r) >= KEYS, KEYS - set(r)
    for key in THROUGHPUTS | SECONDS | FRACTIONS:
        assert math.isfinite(r[key]), (key, r[key])
    for key in THROUGHPUTS | SECONDS:
        assert r[key] > 0, (key, r[key])
    for key in FRACTIONS:  # 1 - exposed / unprefetched seconds: below 1, its sign is the machine's
        assert r[key] < 1, (key, r[key])
    assert r["repeats"] == 1
    assert r["torch_threads"] >= 1
    # the state is about the asked-for size, in many tensors
    assert 1.5e6 < r["state_bytes"] < 2.5e6
    assert r["tensors"] > 10
    # dedup: two references on one base hold one stored copy of it, not two
    assert r["dedup_jobs"] == 2
    assert r["host_bytes_without_dedup"] == 2 * r["base_bytes"]
    assert 0 < r["host_bytes_one_base_copy"] <= r["base_bytes"]
    assert r["host_bytes_one_base_copy"] <= r["host_bytes_with_dedup"] < r["host_bytes_without_dedup"]
    # the hinted round really took B's state from the prefetch (else the fraction means nothing)
    assert r["prefetches_used"] == 1
    assert r["job_state_bytes"] > r["state_bytes"]  # weights plus rollout copy, grads and moments


@pytest.mark.parametrize(("flags", "field"), [(["--size-mb", "0"], "--size-mb"), (["--jobs", "1"], "--jobs"),
                                              (["--repeats", "0"], "--repeats")])
def test_bench_state_bad_input_is_one_line(run_plexrl, flags, field):
    result = run_plexrl("bench", "state", *flags, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"plexrl: error: {field}:"), result.stderr


def test_bench_state_refuses_a_size_whose_peak_memory_does_not_fit(run_plexrl):
    # small enough for the host tier (16 bytes per byte), too big for the run's peak (66 per byte)
    size_mb = 0.95 * default_host_budget() / 16 / MB
    assert STATE_BENCH_MEMORY_PER_BYTE * size_mb * MB > available_memory()
    result = run_plexrl("bench", "state", "--size-mb", f"{size_mb:.0f}", timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("plexrl: error: --size-mb:"), result.stderr
    assert "GB of memory at its peak" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
