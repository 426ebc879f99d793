"""``plexrl bench state``: StateManager swaps against a plain copy, base-weight dedup, and how much
of a switch a prefetch hint hides."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.bench.harness import print_rows, time_calls, train_batch


def add_parser(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser("state", help="StateManager swaps vs a plain copy, base-weight dedup, prefetch overlap")
    s.add_argument("--json", action="store_true")
    s.add_argument("--size-mb", type=float, default=48.0,
                   help="fp32 weight bytes of the bench model, in MB (1e6 bytes)")
    s.add_argument("--jobs", type=int, default=4, help="jobs whose frozen references share one base model")
    s.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median reported)")
    s.set_defaults(func=cmd_bench_state)


MB, GB = 1e6, 1e9
HEAD_DIM = 64
FB_BATCH = 64  # sequences per forward_backward of the prefetch measurement


def bench_model_config(nbytes: float) -> dict[str, int]:
    """A Qwen2 shape whose fp32 weights take about ``nbytes``, with realistic proportions: about a
    fifth in the tied embedding, the rest in decoder layers of ~8 (attention with grouped KV heads
    of 64 dims, an MLP 5.4x as wide, as Qwen2-0.5B)."""
    params = nbytes / 4
    hidden = max(HEAD_DIM, HEAD_DIM * round(math.sqrt(0.8 * params / 8 / 18.5) / HEAD_DIM))
    heads = hidden // HEAD_DIM
    kv_heads = 2 if heads % 2 == 0 and heads >= 4 else 1
    inter = HEAD_DIM * max(1, round(5.4 * hidden / HEAD_DIM))
    kv = kv_heads * HEAD_DIM
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 3 * hidden + 2 * kv
    return {"hidden_size": hidden, "intermediate_size": inter, "num_layers": max(1, round(0.8 * params / per_layer)),
            "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": HEAD_DIM,
            "vocab_size": max(64, 64 * round(0.2 * params / hidden / 64))}


def save_bench_model(folder: Path, nbytes: float):
    """A randomly initialised (seeded) Qwen2 of about ``nbytes`` and the arithmetic tokenizer,
    saved as a Hugging Face folder; returns the tokenizer."""
    from transformers.utils import logging

    from engine.models.presets import TINY_ARITH
    from engine.models.tiny import make_model, train_tokenizer
    from engine.tasks.arithmetic import sample_problems

    shape = bench_model_config(nbytes)
    vocab = shape.pop("vocab_size")
    tok = train_tokenizer(sample_problems(np.random.default_rng(0), 2000))
    model = make_model(dataclasses.replace(TINY_ARITH, name="bench-state", **shape), max(vocab, len(tok)), tok)
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its "Writing model shards" bar is noise beside the bench's own
    try:
        model.save_pretrained(folder, safe_serialization=True)
    finally:
        if shown:
            logging.enable_progress_bar()
    tok.save_pretrained(folder)
    return tok


def check_state_args(size_mb: float, jobs: int, repeats: int) -> None:
    """Bad input fails before anything starts (one line, exit status 2)."""
    from engine.errors import CliError
    from engine.state.store import default_host_budget

    if not (math.isfinite(size_mb) and size_mb > 0):
        raise CliError(f"--size-mb: must be a positive number of MB, got {size_mb:g}")
    if jobs < 2:
        raise CliError(f"--jobs: at least 2 jobs must share the base model to measure dedup, got {jobs}")
    if repeats < 1:
        raise CliError(f"--repeats: must be at least 1, got {repeats}")
    # two trainable jobs (weights, rollout copy, grads, two AdamW moments) swapped through the host
    # tier, the base once, and the copy measurement's old and new blobs
    need, budget = 16 * size_mb * MB, default_host_budget()
    if need > budget:
        raise CliError(f"--size-mb: {size_mb:g} MB needs about {need / GB:.1f} GB of host memory; "
                       f"this node's host tier holds {budget / GB:.1f} GB")
    # and all of it at once: the host tier, the rank's two training states (one resident, one
    # prefetched, one written behind, and what its allocator keeps for the next swap), activations
    # and the copy measurement's tensors. Peak memory measured on a CPU node: 5.2, 7.4 and 12.4 GB
    # at 48, 96 and 192 MB (Ray's processes included), about 66 bytes per byte of model.
    need, available = STATE_BENCH_MEMORY_PER_BYTE * size_mb * MB, available_memory()
    if need > available:
        raise CliError(f"--size-mb: {size_mb:g} MB needs about {need / GB:.1f} GB of memory at its peak; "
                       f"this machine has {available / GB:.1f} GB available")


STATE_BENCH_MEMORY_PER_BYTE = 66


def available_memory() -> int:
    """Bytes of memory the kernel could give without swapping (``MemAvailable``), else all of it."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB


def _copy_throughputs(client, tensors: dict, device, repeats: int) -> dict[str, float]:
    """StateClient write / read of ``tensors`` (device -> host -> preallocated device tensors)
    against a plain ``copy_`` of the same tensors, each way, in the same process and threads."""
    import torch

    def synced(fn):
        def run():
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        return run

    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    into = {k: torch.empty_like(t) for k, t in tensors.items()}  # plain copy's destination
    read_into = {k: torch.empty_like(t) for k, t in tensors.items()}  # StateClient.read's
    host = {k: t.to("cpu", copy=True) for k, t in tensors.items()}
    host_dst = {k: torch.empty_like(t) for k, t in host.items()}
    model = "bench/state-copy"

    def copy_all(pairs):
        return synced(lambda: [d.copy_(s) for d, s in pairs])

    ops = {  # in this order: each read gets what the write before it wrote
        "plain_in": copy_all([(into[k], host[k]) for k in tensors]),
        "plain_out": copy_all([(host_dst[k], tensors[k]) for k in tensors]),
        # every write is dirty state: new blobs, the previous ones freed when it commits
        "swap_out": synced(lambda: client.write(model, tensors)),
        "swap_in": synced(lambda: client.read(model, list(tensors), into=read_into)),
    }
    samples: dict[str, list[float]] = {k: [] for k in ops}
    for i in range(repeats + 1):  # a warm-up round, then interleaved rounds: machine noise hits all alike
        for k, fn in ops.items():
            took = time_calls(fn, 1)
            if i:
                samples[k] += took
    seconds = {k: float(np.median(v)) for k, v in samples.items()}
    for k, t in tensors.items():  # what came back is what went out
        if not torch.equal(read_into[k], t):
            raise RuntimeError(f"bench state: {k[0]} read back differs from what was written")
    client.call("drop", model)
    return {"plain_copy_gbps": _gbps(nbytes, seconds["plain_in"]),
            "plain_copy_out_gbps": _gbps(nbytes, seconds["plain_out"]),
            "swap_in_gbps": _gbps(nbytes, seconds["swap_in"]),
            "swap_out_gbps": _gbps(nbytes, seconds["swap_out"])}


def bench_state(*, size_mb: float, jobs: int, repeats: int, progress: bool = False) -> dict:
    """Swaps through the StateManager on one node, in one run, against a plain copy.

    - Throughput: a rank-like process (the same torch threads) writes a Qwen2-shaped state of about
      ``size_mb`` with ``StateClient.write`` (device -> host) and reads it back into preallocated
      tensors with ``StateClient.read`` (host -> device); the baseline is ``dst.copy_(src)`` of the
      same tensors each way.
    - Dedup: ``jobs`` frozen references on one base, created through the client API on a swapping
      torch WPG (one resident state) and each made resident once; the StateManager's host bytes
      then, and after the first one alone (one stored copy of the base: a little less than its
      logical ``base_bytes``, since identical tensors such as the norms share a blob).
    - Prefetch: two trainable jobs A and B on that WPG; B's swap-in right after A's
      ``forward_backward``, without and with ``WorkerGroup.prefetch(B)`` sent while A's call runs
      (after A's previous call switched A in, so B is out and the hint reads its current state).
    """
    from engine.client import Client
    from engine.scheduler.router import Router
    from engine.service.runtime import LocalEngine
    from engine.state.manager import state_manager
    from engine.support.progress import progress_bar
    from engine.tasks.arithmetic import sample_problems
    from engine.workers.group import Swapping, WorkerGroup

    bar = progress_bar(total=3 + jobs + 2 * (repeats + 1), desc="bench state", enabled=progress)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plexrl-bench-state-")))
        if not os.environ.get("PLEXRL_HOME"):
            os.environ["PLEXRL_HOME"] = str(tmp / "home")
            stack.callback(os.environ.pop, "PLEXRL_HOME", None)
        model_dir = tmp / "model"
        tok = save_bench_model(model_dir, size_mb * MB)
        bar.update(1)
        batch = train_batch(tok, sample_problems(np.random.default_rng(1), FB_BATCH), FB_BATCH)
        engine = stack.enter_context(LocalEngine())  # its shutdown frees the host tier's shared memory
        threads = engine.config.threads_per_rank
        group = WorkerGroup.start("bench-state-0", threads=threads, data_dir=engine.data_dir,
                                  swapping=Swapping(max_resident=1))
        engine.groups.append(group)  # shut down with the engine
        client = Client(Router([group]))
        manager = state_manager(engine.data_dir)
        out: dict = {"size_mb": size_mb, "repeats": repeats, "torch_threads": threads}
        out.update(_measure_dedup(client, manager, model_dir, batch, jobs, bar))
        out.update(_measure_throughput(engine.data_dir, model_dir, threads, repeats))
        bar.update(1)
        rounds = _measure_prefetch(client, group, model_dir, batch, repeats, bar)
    bar.close()
    out.update(prefetch_figures(rounds))
    return out


def _measure_dedup(client, manager, model_dir: Path, batch, jobs: int, bar) -> dict:
    """``jobs`` frozen references on one base, each made resident once: host bytes with dedup,
    against ``jobs`` separate copies."""
    import ray

    def host_bytes() -> int:
        return ray.get(manager.stats.remote())["host"]["bytes"]

    host_before = host_bytes()
    refs = [client.create_model(f"bench-ref-{i}", "reference", str(model_dir)) for i in range(jobs)]
    one_copy = 0
    for i, ref in enumerate(refs):  # creating the next one swapped the previous one out: each comes back in
        ref.forward(batch).result()
        if i == 0:  # the base's blobs came into host memory once
            one_copy = host_bytes() - host_before
        bar.update(1)
    stats = ray.get(manager.stats.remote())
    base = stats["models"]["bench-ref-0/reference"]  # logical bytes of one reference
    return {"dedup_jobs": jobs, "base_bytes": base, "host_bytes_without_dedup": jobs * base,
            "host_bytes_one_base_copy": one_copy, "host_bytes_with_dedup": stats["host"]["bytes"] - host_before}


def _measure_throughput(data_dir: Path, model_dir: Path, threads: int, repeats: int) -> dict:
    """The base's tensors, written and read by this process as a rank would, against a plain copy."""
    import torch
    from safetensors.torch import load_file

    from engine.state.layout import WHOLE
    from engine.state.manager import state_manager
    from engine.state.rank_client import StateClient
    from engine.workers.devices import worker_device

    device = worker_device(0)
    torch.set_num_threads(threads)
    tensors = {(name, WHOLE): t for f in sorted(model_dir.glob("*.safetensors"))
               for name, t in load_file(f, device=str(device)).items()}
    out = {"state_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
           "tensors": len(tensors), "device": str(device)}
    out.update(_copy_throughputs(StateClient(lambda: state_manager(data_dir), "bench-driver"),
                                 tensors, device, repeats))
    out["swap_in_vs_copy"] = out["swap_in_gbps"] / out["plain_copy_gbps"]
    out["swap_out_vs_copy"] = out["swap_out_gbps"] / out["plain_copy_out_gbps"]
    return out


def _measure_prefetch(client, group, model_dir: Path, batch, repeats: int, bar) -> dict[bool, list[dict]]:
    """Two trainable jobs A and B on one swapping WPG: rounds of B's switch right after A's
    ``forward_backward``, without (False) and with (True) a prefetch hint for B during A's call."""
    import ray

    from engine.client import OptimizerConfig

    rank = group.ranks[0]
    a, b = (client.create_model(f"bench-{n}", "policy", str(model_dir), trainable=True,
                                optimizer_config=OptimizerConfig(lr=1e-5)) for n in ("a", "b"))
    for handle in (a, b):  # full training state: weights, rollout copy, AdamW moments, grads
        handle.forward_backward(batch, "grpo")
        handle.optim_step()
        handle.forward_backward(batch, "grpo").result()
    bar.update(1)

    def round_trip(hint: bool) -> dict[str, float]:
        a.forward(batch).result()  # A is in, B is out (and current in the StateManager)
        started = time.perf_counter()
        fb = a.forward_backward(batch, "grpo")
        if hint:
            group.prefetch(("bench-b", "policy"))
        fb.result()
        a_call = time.perf_counter() - started
        before = ray.get(rank.swap_stats.remote())
        started = time.perf_counter()
        b.forward_backward(batch, "grpo").result()  # A out (written behind), B in
        b_call = time.perf_counter() - started
        after = ray.get(rank.swap_stats.remote())
        delta = {k: after[k] - before[k] for k in ("in", "out", "in_bytes", "in_seconds", "out_seconds",
                                                  "in_prefetched")}
        if delta["in"] != 1 or delta["out"] != 1:
            raise RuntimeError(f"bench state: expected one swap each way, got {delta}")
        return {**delta, "a_call": a_call, "b_call": b_call}

    rounds: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for i in range(repeats + 1):  # the first round of each warms up
        for hint in (False, True):  # interleaved, so machine noise hits both alike
            r = round_trip(hint)
            if i:
                rounds[hint].append(r)
            bar.update(1)
    return rounds


def prefetch_figures(rounds: dict[bool, list[dict[str, float]]]) -> dict:
    """Medians of the prefetch rounds, without and with the hint."""

    def med(hint: bool, key: str) -> float:
        return float(np.median([r[key] for r in rounds[hint]]))

    def switch(hint: bool) -> float:
        return float(np.median([r["in_seconds"] + r["out_seconds"] for r in rounds[hint]]))

    return {
        "job_state_bytes": int(med(False, "in_bytes")),
        "swap_in_unprefetched_s": med(False, "in_seconds"),
        "swap_in_exposed_s": med(True, "in_seconds"),
        "prefetch_hidden_fraction": 1 - med(True, "in_seconds") / med(False, "in_seconds"),
        "switch_unprefetched_s": switch(False),
        "switch_prefetched_s": switch(True),
        "switch_hidden_fraction": 1 - switch(True) / switch(False),
        "prefetches_used": int(sum(r["in_prefetched"] for r in rounds[True])),
        "forward_backward_s": {"unprefetched": med(False, "a_call"), "prefetched": med(True, "a_call")},
        # B's call including its switch (A's write-behind runs beside it)
        "switched_call_s": {"unprefetched": med(False, "b_call"), "prefetched": med(True, "b_call")},
    }


def cmd_bench_state(args: argparse.Namespace) -> int:
    from engine.support.progress import is_tty

    check_state_args(args.size_mb, args.jobs, args.repeats)
    r = bench_state(size_mb=args.size_mb, jobs=args.jobs, repeats=args.repeats, progress=is_tty())
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_rows(state_rows(r))
    return 0


def state_rows(r: dict) -> list[tuple[str, str]]:
    """The table rows of a ``bench_state`` result."""
    hidden = f"{100 * r['prefetch_hidden_fraction']:.0f} % hidden"
    switch_hidden = f"{100 * r['switch_hidden_fraction']:.0f} % hidden"
    sc = r["switched_call_s"]
    fb = r["forward_backward_s"]
    return [
        ("state", f"{r['state_bytes'] / MB:.1f} MB in {r['tensors']} tensors, {r['device']}, "
                  f"{r['torch_threads']} threads, {r['repeats']} repeats"),
        ("plain copy in / out", f"{r['plain_copy_gbps']:.2f} / {r['plain_copy_out_gbps']:.2f} GB/s"),
        ("swap in (host -> device)", f"{r['swap_in_gbps']:.2f} GB/s, {r['swap_in_vs_copy']:.2f}x copy"),
        ("swap out (device -> host)", f"{r['swap_out_gbps']:.2f} GB/s, {r['swap_out_vs_copy']:.2f}x copy"),
        (f"host bytes, {r['dedup_jobs']} refs on 1 base",
         f"{r['host_bytes_with_dedup'] / MB:.1f} MB with dedup, {r['host_bytes_without_dedup'] / MB:.1f} MB without"),
        (f"swap-in of B ({r['job_state_bytes'] / MB:.0f} MB)",
         f"{r['swap_in_unprefetched_s']:.3f} s, {r['swap_in_exposed_s']:.3f} s prefetched ({hidden})"),
        ("switch exposed (A out behind + B in)",
         f"{r['switch_unprefetched_s']:.3f} s, {r['switch_prefetched_s']:.3f} s prefetched ({switch_hidden})"),
        ("A's forward_backward", f"{fb['unprefetched']:.3f} s, {fb['prefetched']:.3f} s beside a prefetch"),
        ("B's forward_backward, switch included",
         f"{sc['unprefetched']:.3f} s, {sc['prefetched']:.3f} s prefetched"),
    ]
