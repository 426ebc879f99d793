"""``plexrl bench ...``: benchmarks print a table or JSON and assert nothing about timings."""

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


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (print, never assert)")
    bsub = p.add_subparsers(dest="bench_cmd", required=True)
    e = bsub.add_parser("engine", help="router-path overhead against a direct Ray actor call")
    e.add_argument("--json", action="store_true")
    e.add_argument("--calls", type=int, default=300, help="no-op calls per path")
    e.add_argument("--fb-calls", type=int, default=30, help="forward_backward calls per path")
    e.add_argument("--model", default="tiny-arith")
    e.set_defaults(func=cmd_bench_engine)
    b = bsub.add_parser("backends", help="vLLM vs torch rollout, Megatron TP=1/2 vs torch training, weight sync")
    b.add_argument("--json", action="store_true")
    b.add_argument("--model", default="tiny-arith")
    b.add_argument("--prompts", type=int, default=256, help="prompts per generate call")
    b.add_argument("--samples", type=int, default=8, help="samples per prompt")
    b.add_argument("--max-tokens", type=int, default=8)
    b.add_argument("--train-batch", type=int, default=256, help="sequences per forward_backward")
    b.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median reported)")
    b.set_defaults(func=cmd_bench_backends)
    s = bsub.add_parser("state", help="StateManager swaps vs a plain copy, base-weight dedup, prefetch overlap")
    s.add_argument("--json", action="store_true")
    s.add_argument("--size-mb", type=float, default=48.0,
                   help="fp32 weight bytes of the bench model, in MB (1e6 bytes)")
    s.add_argument("--jobs", type=int, default=4, help="jobs whose frozen references share one base model")
    s.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median reported)")
    s.set_defaults(func=cmd_bench_state)
    from engine.bench_mux import add_mux_bench

    add_mux_bench(bsub)


def _percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def _train_batch(tok, problems, size: int):
    """``size`` training rows cycling over ``problems`` (answer + EOS as completions), advantages
    spread over [-1, 1] so a GRPO loss has gradients."""
    import torch

    from engine.api import Batch

    prompts = [tok.encode(p.prompt) for p in problems]
    completions = [[*tok.encode(p.answer), tok.eos_token_id] for p in problems]
    return Batch(prompts=[prompts[i % len(prompts)] for i in range(size)],
                 completions=[completions[i % len(completions)] for i in range(size)],
                 advantages=torch.linspace(-1, 1, size))


def _print_rows(rows: list[tuple[str, str]]) -> None:
    """A two-column table: names left-aligned, values right-aligned."""
    name_w = max(28, *(len(n) + 2 for n, _ in rows))
    value_w = max(28, *(len(v) for _, v in rows))
    for name, value in rows:
        print(f"{name:<{name_w}}{value:>{value_w}}")


def _time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _relay_class():
    import ray

    @ray.remote(num_cpus=0)
    class Relay:
        """The least a scheduler actor on the call path can cost: receive a call, forward it to
        the rank, await the result, return it (no queue, no decision, no metering)."""

        async def call(self, rank, request):
            return await rank.execute.remote(request)

    return Relay


def bench_engine(calls: int, fb_calls: int, model: str) -> dict:
    import ray
    import torch

    from engine.api import Batch, OptimizerConfig, Request
    from engine.models import resolve_model
    from engine.router import Router
    from engine.runtime import LocalEngine

    model_dir = resolve_model(model)
    with LocalEngine() as engine:
        group = engine.start_group("bench-0")
        router = Router([group])
        router.create("bench", "policy", model_dir, trainable=True, optimizer=OptimizerConfig())
        rank = group.ranks[0]
        batch = Batch(prompts=[[5, 6, 7, 8, 9]] * 64, completions=[[10, 11, 12, 1]] * 64,
                      advantages=torch.ones(64))
        fb_payload = {"batch": batch, "loss": "grpo", "loss_config": {}}

        def direct(fn, payload):
            return lambda: ray.get(rank.execute.remote(Request("bench", "policy", fn, payload)))

        def routed(fn, payload):
            return lambda: router.call("bench", "policy", fn, payload).result()

        relay = _relay_class().remote()

        def relayed(fn, payload):
            return lambda: ray.get(relay.call.remote(rank, Request("bench", "policy", fn, payload)))

        results = {}
        for name, fn, payload, n in (("noop", "noop", {}, calls),
                                     ("forward_backward", "forward_backward", fb_payload, fb_calls)):
            for warm in (direct(fn, payload), routed(fn, payload), relayed(fn, payload)):
                _time_calls(warm, max(3, n // 10))
            # interleave the paths so machine noise hits them alike
            d, r, h = [], [], []
            for _ in range(n):
                d += _time_calls(direct(fn, payload), 1)
                r += _time_calls(routed(fn, payload), 1)
                h += _time_calls(relayed(fn, payload), 1)
            results[name] = {"direct": _percentiles(d), "router": _percentiles(r), "relay": _percentiles(h)}
    noop, fb = results["noop"], results["forward_backward"]
    over50 = noop["router"]["p50_ms"] - noop["direct"]["p50_ms"]
    over99 = noop["router"]["p99_ms"] - noop["direct"]["p99_ms"]
    fb_over = fb["router"]["p50_ms"] - fb["direct"]["p50_ms"]
    return {
        "router_overhead_p50_ms": over50,
        # of which one more Ray actor hop (caller -> actor -> rank) costs, whatever the actor does:
        "actor_hop_p50_ms": noop["relay"]["p50_ms"] - noop["direct"]["p50_ms"],
        "router_overhead_p99_ms": over99,
        "forward_backward_overhead_p50_ms": fb_over,
        "overhead_pct_of_forward_backward": 100.0 * over50 / fb["direct"]["p50_ms"],
        "calls": {"noop": calls, "forward_backward": fb_calls},
        "detail": results,
    }


def cmd_bench_engine(args: argparse.Namespace) -> int:
    result = bench_engine(args.calls, args.fb_calls, args.model)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'call':<18}{'path':<8}{'p50 ms':>10}{'p99 ms':>10}")
    for name, paths in result["detail"].items():
        for path, s in paths.items():
            print(f"{name:<18}{path:<8}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}")
    print(f"router overhead p50 {result['router_overhead_p50_ms']:.3f} ms, "
          f"p99 {result['router_overhead_p99_ms']:.3f} ms, "
          f"{result['overhead_pct_of_forward_backward']:.2f} % of a forward_backward; "
          f"a bare relay actor on the path costs {result['actor_hop_p50_ms']:.3f} ms p50")
    return 0


# -- plexrl bench backends ---------------------------------------------------------------------


def _median_seconds(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls after a warm-up call, and the warm-up's result (every
    call gets the same inputs)."""
    result = fn()
    return float(np.median(_time_calls(fn, repeats))), result


def bench_backends(*, model: str, prompts: int, samples: int, max_tokens: int, train_batch: int,
                   repeats: int, progress: bool = False) -> dict:
    """Every backend on the same model: rollout tokens/s, one training step, one weight sync.

    Rollout: the same prompts and sampling settings on a vLLM and a torch WPG (one rank each, same
    threads). Training: one ``forward_backward`` over ``train_batch`` sequences plus ``optim_step``
    on Megatron TP=1, Megatron TP=2 and torch. Sync: ``sync_weights`` of a policy trained on
    Megatron TP=2 into the vLLM engine, through the router (the path a job takes).
    """
    import ray
    from tqdm import tqdm

    from engine.api import OptimizerConfig, Request, SamplingParams
    from engine.models import resolve_model
    from engine.rl.tasks import sample_problems
    from engine.router import Router
    from engine.runtime import EngineConfig, LocalEngine
    from engine.tokenizer import load_tokenizer

    model_dir = resolve_model(model)
    tok = load_tokenizer(model_dir)
    problems = sample_problems(np.random.default_rng(0), prompts)
    prompt_ids = [tok.encode(p.prompt) for p in problems]
    sampling = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, seed=0)
    config = EngineConfig()
    threads = config.threads_per_rank
    bar = tqdm(total=5, desc="bench backends", disable=not progress)
    out: dict = {"model": str(model_dir), "prompts": prompts, "samples": samples, "max_tokens": max_tokens,
                 "train_batch": train_batch, "repeats": repeats, "threads_per_rank": threads}
    with LocalEngine(config) as engine:
        slot = config.devices / 5  # five ranks in all share the node's device slots
        torch_g = engine.start_group("bench-torch", "torch", devices_per_rank=slot)
        vllm_g = engine.start_group("bench-vllm", "vllm", devices_per_rank=slot)

        def direct(group, fn, payload, dep=("bench", "policy")):
            return lambda: ray.get(group.submit(Request(dep[0], dep[1], fn, payload)))

        # rollout throughput, same prompts and settings on both engines
        for name, group in (("vllm", vllm_g), ("torch", torch_g)):
            group.create(("bench", "policy"), model_dir, trainable=False, optimizer=None)
            seconds, completions = _median_seconds(
                direct(group, "generate", {"prompts": prompt_ids, "sampling": sampling}), repeats)
            tokens = sum(len(c.token_ids) for c in completions)
            out[f"{name}_tokens_per_s"] = tokens / seconds
            out[f"{name}_generate_s"] = seconds
            out[f"{name}_tokens"] = tokens
            bar.update(1)
        out["vllm_speedup"] = out["vllm_tokens_per_s"] / out["torch_tokens_per_s"]

        # one training step on each trainer
        batch = _train_batch(tok, problems, train_batch)
        optimizer = OptimizerConfig(lr=1e-5)

        def train_step(group):
            fb = direct(group, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}},
                        ("bench", "trainer"))
            opt = direct(group, "optim_step", {}, ("bench", "trainer"))
            return lambda: (fb(), opt())

        torch_g.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
        out["torch_train_step_s"], _ = _median_seconds(train_step(torch_g), repeats)
        bar.update(1)
        tp1 = engine.start_group("bench-megatron-tp1", "megatron", 1, devices_per_rank=slot)
        tp1.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
        out["megatron_tp1_step_s"], _ = _median_seconds(train_step(tp1), repeats)
        bar.update(1)
        tp2 = engine.start_group("bench-megatron-tp2", "megatron", 2, devices_per_rank=slot,
                                 threads=engine.threads_per_rank(2))
        tp2.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
        out["megatron_tp2_step_s"], _ = _median_seconds(train_step(tp2), repeats)
        out["megatron_tp2_threads_per_rank"] = engine.threads_per_rank(2)
        bar.update(1)

        # weight sync across layouts: Megatron TP=2 shards -> vLLM, one logical tensor at a time
        router = Router([tp2, vllm_g])
        router.create("sync", "policy", model_dir, trainable=True, optimizer=optimizer)
        out["weight_sync_s"], result = _median_seconds(
            lambda: router.call("sync", "policy", "sync_weights", {}).result(), repeats)
        out["weight_sync_bytes"] = result["bytes"]
        out["weight_sync_inner_s"] = result["seconds"]
        bar.update(1)
    bar.close()
    return out


def cmd_bench_backends(args: argparse.Namespace) -> int:
    from engine.cli import _is_tty

    result = bench_backends(model=args.model, prompts=args.prompts, samples=args.samples, max_tokens=args.max_tokens,
                            train_batch=args.train_batch, repeats=args.repeats, progress=_is_tty())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    rows = [
        ("rollout vLLM", f"{result['vllm_tokens_per_s']:.0f} tokens/s"),
        ("rollout torch", f"{result['torch_tokens_per_s']:.0f} tokens/s"),
        ("vLLM / torch", f"{result['vllm_speedup']:.2f}x"),
        ("train step torch", f"{result['torch_train_step_s']:.3f} s"),
        ("train step Megatron TP=1", f"{result['megatron_tp1_step_s']:.3f} s"),
        ("train step Megatron TP=2", f"{result['megatron_tp2_step_s']:.3f} s"),
        ("weight sync TP=2 -> vLLM", f"{result['weight_sync_s']:.3f} s, {result['weight_sync_bytes']} bytes"),
    ]
    _print_rows(rows)
    return 0


# -- plexrl bench state ------------------------------------------------------------------------

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

    from engine.models.tiny import TINY_ARITH, make_model, train_tokenizer
    from engine.rl.tasks import sample_problems

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
    from engine.cli import CliError
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
            took = _time_calls(fn, 1)
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
    import ray
    import torch
    from safetensors.torch import load_file
    from tqdm import tqdm

    from engine.client import Client, OptimizerConfig
    from engine.rl.tasks import sample_problems
    from engine.router import Router
    from engine.runtime import LocalEngine
    from engine.state.client import StateClient
    from engine.state.manager import state_manager
    from engine.workers.devices import worker_device
    from engine.workers.group import Swapping, WorkerGroup
    from engine.workers.layout import WHOLE

    bar = tqdm(total=3 + jobs + 2 * (repeats + 1), desc="bench state", disable=not progress)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plexrl-bench-state-")))
        if not os.environ.get("PLEXRL_HOME"):
            os.environ["PLEXRL_HOME"] = str(tmp / "home")
            stack.callback(os.environ.pop, "PLEXRL_HOME", None)
        model_dir = tmp / "model"
        tok = save_bench_model(model_dir, size_mb * MB)
        bar.update(1)
        batch = _train_batch(tok, sample_problems(np.random.default_rng(1), FB_BATCH), FB_BATCH)
        engine = stack.enter_context(LocalEngine())  # its shutdown frees the host tier's shared memory
        threads = engine.config.threads_per_rank
        group = WorkerGroup.start("bench-state-0", threads=threads, data_dir=engine.data_dir,
                                  swapping=Swapping(max_resident=1))
        engine.groups.append(group)  # shut down with the engine
        client = Client(Router([group]))
        rank = group.ranks[0]
        manager = state_manager(engine.data_dir)
        out: dict = {"size_mb": size_mb, "repeats": repeats, "torch_threads": threads}

        # dedup: N frozen references on one base, each made resident once
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
        out.update({"dedup_jobs": jobs, "base_bytes": base, "host_bytes_without_dedup": jobs * base,
                    "host_bytes_one_base_copy": one_copy,
                    "host_bytes_with_dedup": stats["host"]["bytes"] - host_before})

        # throughput: the base's tensors, written and read by this process as a rank would
        device = worker_device(0)
        torch.set_num_threads(threads)
        tensors = {(name, WHOLE): t for f in sorted(model_dir.glob("*.safetensors"))
                   for name, t in load_file(f, device=str(device)).items()}
        out.update({"state_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                    "tensors": len(tensors), "device": str(device)})
        out.update(_copy_throughputs(StateClient(lambda: state_manager(engine.data_dir), "bench-driver"),
                                     tensors, device, repeats))
        out["swap_in_vs_copy"] = out["swap_in_gbps"] / out["plain_copy_gbps"]
        out["swap_out_vs_copy"] = out["swap_out_gbps"] / out["plain_copy_out_gbps"]
        del tensors
        bar.update(1)

        # prefetch: B's swap-in right after A's forward_backward, without and with a hint
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
    bar.close()

    def med(hint: bool, key: str) -> float:
        return float(np.median([r[key] for r in rounds[hint]]))

    def switch(hint: bool) -> float:
        return float(np.median([r["in_seconds"] + r["out_seconds"] for r in rounds[hint]]))

    out.update({
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
    })
    return out


def cmd_bench_state(args: argparse.Namespace) -> int:
    from engine.cli import _is_tty

    check_state_args(args.size_mb, args.jobs, args.repeats)
    r = bench_state(size_mb=args.size_mb, jobs=args.jobs, repeats=args.repeats, progress=_is_tty())
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        _print_rows(state_rows(r))
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
