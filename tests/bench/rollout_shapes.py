"""vLLM against torch generate on a larger (random-weight) Qwen2 than the tiny presets.

    python tests/bench/rollout_shapes.py [--hidden 512] [--layers 8] [--prompts 32] [--samples 8]
                                         [--max-tokens 128] [--repeats 3]

``plexrl bench backends`` compares the rollout engines on ``tiny-arith``, where a 3-token answer
from a 0.1M-parameter model costs less to compute than vLLM's per-request bookkeeping. This builds a
Qwen2 of ``hidden`` x ``layers`` (heads of 64, an MLP 4x as wide, tiny-arith's tokenizer, random
weights, so answers run until a sampled EOS) and times ``generate`` on both backends with the same
prompts and sampling settings (temperature 1), alternating, then prints tokens/s medians and their
ratio as JSON. A benchmark: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.api import SamplingParams
    from engine.models import resolve_model
    from engine.tasks.arithmetic import sample_problems
    from engine.workers.tokenizer import load_tokenizer
    from engine.workers.torch_backend import TorchBackend
    from engine.workers.vllm_backend import VllmBackend

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    preset = resolve_model("tiny-arith", progress=True)
    tok = load_tokenizer(preset)
    work = Path(tempfile.mkdtemp(prefix="rollout-shapes-"))
    model_dir = work / "model"
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256), head_dim=64, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    del model
    for f in preset.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, model_dir / f.name)
    prompts = [tok.encode(p.prompt) for p in sample_problems(np.random.default_rng(0), args.prompts)]
    deployment = ("bench", "policy")
    backends = {}
    for name, cls in (("vllm", VllmBackend), ("torch", TorchBackend)):
        backends[name] = cls(rank=0, world_size=1, data_dir=work / name)
        backends[name].create(deployment, model_dir, trainable=False, optimizer=None)

    def generate(name: str, seed: int) -> tuple[float, int]:
        sampling = SamplingParams(n=args.samples, temperature=1.0, max_tokens=args.max_tokens, seed=seed)
        started = time.perf_counter()
        out = backends[name].execute(deployment, "generate", {"prompts": prompts, "sampling": sampling})
        return time.perf_counter() - started, sum(len(c.token_ids) for c in out)

    rates: dict[str, list[float]] = {name: [] for name in backends}
    tokens: dict[str, list[int]] = {name: [] for name in backends}
    for name in backends:
        generate(name, 0)  # warm-up
    for r in range(args.repeats):
        for name in backends:
            seconds, n = generate(name, r + 1)
            rates[name].append(n / seconds)
            tokens[name].append(n)
    vllm, torch_rate = statistics.median(rates["vllm"]), statistics.median(rates["torch"])
    print(json.dumps({
        "params": params, "hidden": args.hidden, "layers": args.layers, "prompts": args.prompts,
        "samples": args.samples, "max_tokens": args.max_tokens, "threads": args.threads,
        "vllm_tokens_per_s": vllm, "torch_tokens_per_s": torch_rate, "vllm_speedup": vllm / torch_rate,
        "tokens_per_sample": {k: statistics.mean(v) / (args.prompts * args.samples) for k, v in tokens.items()},
    }, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
