"""``plexrl bench engine``: the router path's overhead against a direct Ray actor call."""

from __future__ import annotations

import argparse
import json

from engine.bench.harness import percentiles, time_calls


def add_parser(bsub: argparse._SubParsersAction) -> None:
    e = bsub.add_parser("engine", help="router-path overhead against a direct Ray actor call")
    e.add_argument("--json", action="store_true")
    e.add_argument("--calls", type=int, default=300, help="no-op calls per path")
    e.add_argument("--fb-calls", type=int, default=30, help="forward_backward calls per path")
    e.add_argument("--model", default="tiny-arith")
    e.set_defaults(func=cmd_bench_engine)


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
    from engine.scheduler.router import Router
    from engine.service.runtime import LocalEngine

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
                time_calls(warm, max(3, n // 10))
            # interleave the paths so machine noise hits them alike
            d, r, h = [], [], []
            for _ in range(n):
                d += time_calls(direct(fn, payload), 1)
                r += time_calls(routed(fn, payload), 1)
                h += time_calls(relayed(fn, payload), 1)
            results[name] = {"direct": percentiles(d), "router": percentiles(r), "relay": percentiles(h)}
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
