"""A small timing table for the GPU check (printed, never asserted): the backends on CUDA with a
random Qwen2 of about 100M parameters, in this process (no Ray)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.api import Batch, OptimizerConfig, SamplingParams


def build(path: Path) -> None:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {f"t{i}": i for i in range(32000)}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t2")),
                                   pad_token="t0", eos_token="t1", unk_token="t2")
    config = Qwen2Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                         num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)


def timed(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 32000, (64, 32), generator=gen).tolist()
    completions = torch.randint(3, 32000, (64, 32), generator=gen).tolist()
    batch = Batch(prompts=prompts, completions=completions, advantages=torch.linspace(-1, 1, 64))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build(model_dir)
        from engine.workers.torch_backend import TorchBackend

        backends = [("torch", TorchBackend(rank=0, world_size=1, data_dir=Path(tmp)))]
        if importlib.util.find_spec("megatron") is not None:
            from engine.workers.megatron_backend import MegatronBackend

            backends.append(("megatron tp1", MegatronBackend(rank=0, world_size=1, data_dir=Path(tmp))))
        for name, backend in backends:
            dep = ("timing", name)
            backend.create(dep, model_dir, trainable=True, optimizer=OptimizerConfig(lr=1e-5))

            def step(backend=backend, dep=dep):
                backend.execute(dep, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}})
                backend.execute(dep, "optim_step", {})

            def forward(backend=backend, dep=dep):
                backend.execute(dep, "forward", {"batch": batch})

            rows.append((f"{name} train step (64 x 64 tokens)", f"{timed(step):.4f} s"))
            rows.append((f"{name} forward (64 x 64 tokens)", f"{timed(forward):.4f} s"))
        torch_backend = backends[0][1]
        sampling = SamplingParams(n=8, temperature=1.0, max_tokens=32, seed=0)
        seconds = timed(lambda: torch_backend.execute(("timing", "torch"), "generate",
                                                      {"prompts": prompts[:32], "sampling": sampling}), 3)
        rows.append(("torch generate (32 x 8 x 32 tokens)", f"{32 * 8 * 32 / seconds:.0f} tokens/s max"))
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    for name, value in rows:
        print(f"{name:<40}{value:>24}")


if __name__ == "__main__":
    main()
