"""The backends on a CUDA device (skipped without one; CI has none).

Run by ``tests/gpu/run.sh`` on a GPU machine, without Ray: each test drives a backend object in
this process, as a worker rank would. Models are tiny random Qwen2s built here (no hub access).
vLLM is skipped where it is not installed; Megatron runs at TP=1 (one GPU).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from engine.api import Batch, OptimizerConfig, SamplingParams
from engine.workers.sampling import sequence_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]]


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 matmuls without TF32, so GPU log-probs can be held to CPU tolerances."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {f"t{i}": i for i in range(64)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t2")
    config = Qwen2Config(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                         initializer_range=0.1)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpu-model")
    Qwen2ForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def _batch() -> Batch:
    completions = [[20, 21, 1], [22, 1], [23, 24, 25, 1]]
    return Batch(prompts=PROMPTS, completions=completions, advantages=torch.tensor([1.0, -0.5, 0.25]))


def _cpu_logprobs(model_dir, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return sequence_logprobs(model, batch.prompts, batch.completions, pad_id=0)[0]


def test_torch_backend_runs_every_function_on_cuda(model_dir, tmp_path):
    from engine.workers.torch_backend import TorchBackend

    backend = TorchBackend(rank=0, world_size=1, data_dir=tmp_path)
    dep = ("gpu", "policy")
    backend.create(dep, model_dir, trainable=True, optimizer=OptimizerConfig(lr=1e-3))
    assert next(backend.states[dep].model.parameters()).is_cuda
    batch = _batch()
    out = backend.execute(dep, "forward", {"batch": batch})
    assert (torch.as_tensor(out.logprobs) - _cpu_logprobs(model_dir, batch)).abs().max() <= 1e-4
    completions = backend.execute(dep, "generate", {"prompts": PROMPTS, "sampling": SamplingParams(n=4, seed=1)})
    assert len(completions) == 4 * len(PROMPTS)
    again = backend.execute(dep, "generate", {"prompts": PROMPTS, "sampling": SamplingParams(n=4, seed=1)})
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]  # seeded on the CPU
    loss = backend.execute(dep, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}})
    assert loss.tokens == 9
    stepped = backend.execute(dep, "optim_step", {})
    assert stepped["grad_norm"] > 0
    backend.execute(dep, "save_checkpoint", {"tag": "t"})
    backend.execute(dep, "load_checkpoint", {"tag": "t"})
    backend.execute(dep, "sync_weights", {})
    after = backend.execute(dep, "forward", {"batch": batch})
    assert not np.array_equal(after.logprobs, out.logprobs)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_megatron_tp1_matches_transformers_on_cuda(model_dir, tmp_path):
    from engine.workers.megatron_backend import MegatronBackend

    backend = MegatronBackend(rank=0, world_size=1, data_dir=tmp_path)
    assert backend.device.type == "cuda"
    dep = ("gpu", "policy")
    backend.create(dep, model_dir, trainable=True, optimizer=OptimizerConfig(lr=1e-3))
    batch = _batch()
    out = backend.execute(dep, "forward", {"batch": batch})
    assert (torch.as_tensor(out.logprobs) - _cpu_logprobs(model_dir, batch)).abs().max() <= 1e-4
    backend.execute(dep, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}})
    assert backend.execute(dep, "optim_step", {})["grad_norm"] > 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_greedy_matches_transformers_on_cuda(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from engine.workers.sampling import sample
    from engine.workers.vllm_backend import VllmBackend

    backend = VllmBackend(rank=0, world_size=1, data_dir=tmp_path)
    dep = ("gpu", "policy")
    backend.create(dep, model_dir, trainable=False, optimizer=None)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=6)
    got = [c.token_ids for c in backend.execute(dep, "generate", {"prompts": PROMPTS, "sampling": greedy})]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    want = [sample(model, [p], max_tokens=6, temperature=0.0, eos_id=1, pad_id=0, generator=None)[0][0]
            for p in PROMPTS]
    assert got == want
