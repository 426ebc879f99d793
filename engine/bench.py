"""``plexrl bench ...``: benchmarks print a table or JSON and assert nothing about timings."""

from __future__ import annotations

import argparse
import json
import sys
import time

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


def _percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def _time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


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

        results = {}
        for name, fn, payload, n in (("noop", "noop", {}, calls),
                                     ("forward_backward", "forward_backward", fb_payload, fb_calls)):
            for warm in (direct(fn, payload), routed(fn, payload)):
                _time_calls(warm, max(3, n // 10))
            # interleave the two paths so machine noise hits both alike
            d, r = [], []
            for _ in range(n):
                d += _time_calls(direct(fn, payload), 1)
                r += _time_calls(routed(fn, payload), 1)
            results[name] = {"direct": _percentiles(d), "router": _percentiles(r)}
    noop, fb = results["noop"], results["forward_backward"]
    over50 = noop["router"]["p50_ms"] - noop["direct"]["p50_ms"]
    over99 = noop["router"]["p99_ms"] - noop["direct"]["p99_ms"]
    fb_over = fb["router"]["p50_ms"] - fb["direct"]["p50_ms"]
    return {
        "router_overhead_p50_ms": over50,
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
          f"{result['overhead_pct_of_forward_backward']:.2f} % of a forward_backward")
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
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from engine.api import Batch, OptimizerConfig, Request, SamplingParams
    from engine.models import resolve_model
    from engine.rl.tasks import sample_problems
    from engine.router import Router
    from engine.runtime import EngineConfig, LocalEngine

    model_dir = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(model_dir)
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
        rows = [prompt_ids[i % len(prompt_ids)] for i in range(train_batch)]
        completions = [[*tok.encode(p.answer), tok.eos_token_id] for p in problems]
        batch = Batch(prompts=rows, completions=[completions[i % len(completions)] for i in range(train_batch)],
                      advantages=torch.linspace(-1, 1, train_batch))
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
    result = bench_backends(model=args.model, prompts=args.prompts, samples=args.samples, max_tokens=args.max_tokens,
                            train_batch=args.train_batch, repeats=args.repeats, progress=sys.stderr.isatty())
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
    for name, value in rows:
        print(f"{name:<28}{value:>28}")
    return 0
