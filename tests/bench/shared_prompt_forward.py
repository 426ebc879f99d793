"""Forward + backward on a GRPO-shaped batch, one row per completion against each prompt once.

    python tests/bench/shared_prompt_forward.py [--prompts 64] [--samples 8] [--threads 2]

Samples ``samples`` answers per prompt from the ``tiny-arith`` preset (temperature 1), then times
``sequence_logprobs`` (one padded row per completion) and ``shared_prompt_logprobs`` (each prompt
once, completions packed behind it) with a backward pass, alternating, and prints the medians, their
ratio and the largest log-prob difference as JSON. A benchmark: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from engine.models import resolve_model
    from engine.tasks.arithmetic import sample_problems
    from engine.workers.sampling import sample, sequence_logprobs, shared_prompt_logprobs
    from engine.workers.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    path = resolve_model("tiny-arith", progress=True)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [tok.encode(p.prompt) for p in sample_problems(np.random.default_rng(0), args.prompts)]
    completions, _ = sample(model, prompts, n=args.samples, max_tokens=8, temperature=1.0,
                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                            generator=torch.Generator().manual_seed(0))
    rows = [prompts[i // args.samples] for i in range(len(completions))]

    def step(fn):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        logp, _ = fn(model, rows, completions, tok.pad_token_id)
        logp.sum().backward()
        return time.perf_counter() - started, logp.detach()

    times: dict[str, list[float]] = {"rows": [], "shared": []}
    for _ in range(args.repeats):
        for name, fn in (("rows", sequence_logprobs), ("shared", shared_prompt_logprobs)):
            times[name].append(step(fn)[0])
    _, plain = step(sequence_logprobs)
    _, packed = step(shared_prompt_logprobs)
    rows_s, shared_s = statistics.median(times["rows"]), statistics.median(times["shared"])
    print(json.dumps({
        "rows": len(rows), "prompts": args.prompts, "samples": args.samples, "threads": args.threads,
        "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
        "completion_tokens_mean": float(np.mean([len(c) for c in completions])),
        "rows_forward_backward_s": rows_s, "shared_forward_backward_s": shared_s,
        "speedup": rows_s / shared_s, "max_abs_logprob_diff": float((plain - packed).abs().max()),
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
