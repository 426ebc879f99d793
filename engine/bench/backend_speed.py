"""``plexrl bench backends``: vLLM against torch rollout, Megatron TP=1/2 against torch training,
and a weight sync across layouts, on the same model."""

from __future__ import annotations

import argparse
import json

import numpy as np

from engine.bench.harness import median_seconds, print_rows, train_batch


def add_parser(bsub: argparse._SubParsersAction) -> None:
    b = bsub.add_parser("backends", help="vLLM vs torch rollout, Megatron TP=1/2 vs torch training, weight sync")
    b.add_argument("--json", action="store_true")
    b.add_argument("--model", default="tiny-arith")
    b.add_argument("--prompts", type=int, default=256, help="prompts per generate call")
    b.add_argument("--samples", type=int, default=8, help="samples per prompt")
    b.add_argument("--max-tokens", type=int, default=8)
    b.add_argument("--train-batch", type=int, default=256, help="sequences per forward_backward")
    b.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median reported)")
    b.set_defaults(func=cmd_bench_backends)


def bench_backends(*, model: str, prompts: int, samples: int, max_tokens: int, train_batch_size: int,
                   repeats: int, progress: bool = False) -> dict:
    """Every backend on the same model: rollout tokens/s, one training step, one weight sync.

    Rollout: the same prompts and sampling settings on a vLLM and a torch WPG (one rank each, same
    threads). Training: one ``forward_backward`` over ``train_batch`` sequences plus ``optim_step``
    on Megatron TP=1, Megatron TP=2 and torch. Sync: ``sync_weights`` of a policy trained on
    Megatron TP=2 into the vLLM engine, through the router (the path a job takes).
    """
    from engine.api import SamplingParams
    from engine.models import resolve_model
    from engine.service.runtime import EngineConfig, LocalEngine
    from engine.support.progress import progress_bar
    from engine.tasks.arithmetic import sample_problems
    from engine.workers.tokenizer import load_tokenizer

    model_dir = resolve_model(model)
    tok = load_tokenizer(model_dir)
    problems = sample_problems(np.random.default_rng(0), prompts)
    prompt_ids = [tok.encode(p.prompt) for p in problems]
    sampling = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, seed=0)
    config = EngineConfig()
    threads = config.threads_per_rank
    bar = progress_bar(total=5, desc="bench backends", enabled=progress)
    out: dict = {"model": str(model_dir), "prompts": prompts, "samples": samples, "max_tokens": max_tokens,
                 "train_batch": train_batch_size, "repeats": repeats, "threads_per_rank": threads}
    with LocalEngine(config) as engine:
        slot = config.devices / 5  # five ranks in all share the node's device slots
        torch_g = engine.start_group("bench-torch", "torch", devices_per_rank=slot)
        vllm_g = engine.start_group("bench-vllm", "vllm", devices_per_rank=slot)
        out.update(_measure_rollout(model_dir, {"vllm": vllm_g, "torch": torch_g}, prompt_ids, sampling, repeats, bar))
        batch = train_batch(tok, problems, train_batch_size)
        training, tp2 = _measure_training(engine, model_dir, torch_g, slot, batch, repeats, bar)
        out.update(training)
        out.update(_measure_sync(model_dir, tp2, vllm_g, repeats))
        bar.update(1)
    bar.close()
    return out


def cmd_bench_backends(args: argparse.Namespace) -> int:
    from engine.support.progress import is_tty

    result = bench_backends(model=args.model, prompts=args.prompts, samples=args.samples, max_tokens=args.max_tokens,
                            train_batch_size=args.train_batch, repeats=args.repeats, progress=is_tty())
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
    print_rows(rows)
    return 0


def _direct(group, fn: str, payload: dict, dep: tuple[str, str] = ("bench", "policy")):
    """A call straight to the group's ranks, bypassing router and scheduler (what a backend costs)."""
    import ray

    from engine.api import Request

    return lambda: ray.get(group.submit(Request(dep[0], dep[1], fn, payload)))


def _measure_rollout(model_dir, groups: dict, prompt_ids, sampling, repeats: int, bar) -> dict:
    """Rollout throughput: the same prompts and sampling settings on each engine."""
    out: dict = {}
    for name, group in groups.items():
        group.create(("bench", "policy"), model_dir, trainable=False, optimizer=None)
        seconds, completions = median_seconds(
            _direct(group, "generate", {"prompts": prompt_ids, "sampling": sampling}), repeats)
        tokens = sum(len(c.token_ids) for c in completions)
        out[f"{name}_tokens_per_s"] = tokens / seconds
        out[f"{name}_generate_s"] = seconds
        out[f"{name}_tokens"] = tokens
        bar.update(1)
    out["vllm_speedup"] = out["vllm_tokens_per_s"] / out["torch_tokens_per_s"]
    return out


def _measure_training(engine, model_dir, torch_g, slot: float, batch, repeats: int, bar) -> tuple[dict, object]:
    """One training step (``forward_backward`` + ``optim_step``) on torch, Megatron TP=1 and TP=2;
    and the TP=2 group, which the sync measurement trains from."""
    from engine.api import OptimizerConfig

    optimizer = OptimizerConfig(lr=1e-5)

    def train_step(group):
        fb = _direct(group, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}},
                     ("bench", "trainer"))
        opt = _direct(group, "optim_step", {}, ("bench", "trainer"))
        return lambda: (fb(), opt())

    out: dict = {}
    torch_g.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
    out["torch_train_step_s"], _ = median_seconds(train_step(torch_g), repeats)
    bar.update(1)
    tp1 = engine.start_group("bench-megatron-tp1", "megatron", 1, devices_per_rank=slot)
    tp1.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
    out["megatron_tp1_step_s"], _ = median_seconds(train_step(tp1), repeats)
    bar.update(1)
    tp2 = engine.start_group("bench-megatron-tp2", "megatron", 2, devices_per_rank=slot,
                             threads=engine.threads_per_rank(2))
    tp2.create(("bench", "trainer"), model_dir, trainable=True, optimizer=optimizer)
    out["megatron_tp2_step_s"], _ = median_seconds(train_step(tp2), repeats)
    out["megatron_tp2_threads_per_rank"] = engine.threads_per_rank(2)
    bar.update(1)
    return out, tp2


def _measure_sync(model_dir, trainer_group, rollout_group, repeats: int) -> dict:
    """``sync_weights`` across layouts (Megatron TP=2 shards -> vLLM, one logical tensor at a time),
    through the router: the path a job takes."""
    from engine.api import OptimizerConfig
    from engine.scheduler.router import Router

    router = Router([trainer_group, rollout_group])
    router.create("sync", "policy", model_dir, trainable=True, optimizer=OptimizerConfig(lr=1e-5))
    seconds, result = median_seconds(lambda: router.call("sync", "policy", "sync_weights", {}).result(), repeats)
    return {"weight_sync_s": seconds, "weight_sync_bytes": result["bytes"], "weight_sync_inner_s": result["seconds"]}
