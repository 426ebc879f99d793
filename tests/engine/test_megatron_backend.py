"""The Megatron-core training backend through real worker groups on Ray, at tensor parallel 1 and 2.

The model is a random grouped-query Qwen2 (4 query heads, 2 KV heads, head_dim 32, tied
embeddings) built here, so TP=2 splits every fused tensor. One TP=1 and one TP=2 group serve the
whole module (each rank takes a quarter device slot, so they fit beside the session's torch group)
and are shut down at its end; every test uses its own deployment names.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

import ray
from safetensors.torch import load_file

from engine.api import Batch, OptimizerConfig, Request
from engine.state.layout import gather_shards
from engine.workers.group import WorkerGroup
from engine.workers.sampling import sequence_logprobs
from engine.workers.torch_backend import TorchBackend

VOCAB = 64
PAD, EOS = 0, 1
DEVICES_PER_RANK = 0.25
LR = 1e-3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, build_gqa_qwen) -> Path:
    return build_gqa_qwen(tmp_path_factory.mktemp("megatron-gqa-tied"), hidden=64, tied=True, seed=0)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory, build_gqa_qwen) -> Path:
    return build_gqa_qwen(tmp_path_factory.mktemp("megatron-gqa-untied"), hidden=64, tied=False, seed=1)


@pytest.fixture(scope="module")
def groups(ray_engine, plexrl_home):
    """``{1: TP=1 group, 2: TP=2 group}``, started concurrently, shut down after the module."""

    def start(tp: int) -> WorkerGroup:
        return WorkerGroup.start(
            f"test-megatron-tp{tp}", "megatron", world_size=tp, threads=1, data_dir=plexrl_home,
            devices_per_rank=DEVICES_PER_RANK,
        )

    with ThreadPoolExecutor(2) as pool:
        started = dict(zip((1, 2), pool.map(start, (1, 2)), strict=True))
    yield started
    for group in started.values():
        group.shutdown()


PROMPTS = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12], [13]]
COMPLETIONS = [[20, 21, EOS], [22, 23, 24, 25, 26, EOS], [27], [28, 29, 30, 31]]
TOKENS = sum(map(len, COMPLETIONS))


@pytest.fixture(scope="module")
def batch(model_dir) -> Batch:
    """Rows of different prompt and completion lengths (right padding matters), with loss inputs:
    old and reference log-probs near the model's own, so some ratios clip and the KL term is live."""
    with torch.no_grad():
        logp, mask = sequence_logprobs(hf_model(model_dir), PROMPTS, COMPLETIONS, PAD)
    gen = torch.Generator().manual_seed(7)
    return Batch(
        prompts=PROMPTS, completions=COMPLETIONS,
        advantages=torch.tensor([1.0, -0.5, 0.25, -1.0]),
        old_logprobs=(logp + 0.3 * torch.randn(logp.shape, generator=gen)) * mask,
        ref_logprobs=(logp + 0.3 * torch.randn(logp.shape, generator=gen)) * mask,
    )


GRPO = {"loss": "grpo", "loss_config": {"clip_eps": 0.2, "kl_coef": 0.1}}


def call_all(group: WorkerGroup, deployment: tuple[str, str], fn: str, **payload) -> list:
    """Every rank's result of one call (the group returns rank 0's; here we check all of them)."""
    request = Request(*deployment, fn, payload)
    return ray.get([r.execute.remote(request) for r in group.ranks])


def create(group, deployment, model_dir, *, trainable=True, optimizer=None) -> dict:
    optimizer = (optimizer or OptimizerConfig(lr=LR)) if trainable else None
    return group.create(deployment, model_dir, trainable=trainable, optimizer=optimizer)


def drop(group, deployment) -> None:
    ray.get([r.drop.remote(deployment) for r in group.ranks])


def gathered(per_rank: list[list]) -> dict[str, torch.Tensor]:
    """Logical tensors from every rank's ``(name, tensor, spec)`` shards."""
    shards: dict[str, list] = {}
    for rank_shards in per_rank:
        for name, tensor, spec in rank_shards:
            shards.setdefault(name, []).append((tensor, spec))
    return {name: gather_shards(parts) for name, parts in shards.items()}


def weights(group, deployment, names=None) -> dict[str, torch.Tensor]:
    return gathered(ray.get([r.export_weights.remote(deployment, names) for r in group.ranks]))


def grads(group, deployment) -> dict[str, torch.Tensor]:
    def read(worker, dep):
        return worker.backend.debug_grad_shards(tuple(dep))

    return gathered(ray.get([r.__ray_call__.remote(read, deployment) for r in group.ranks]))


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_forward_logprobs_match_transformers(groups, batch, model_dir, untied_dir):
    for path in (model_dir, untied_dir):
        with torch.no_grad():
            expected, mask = sequence_logprobs(hf_model(path), PROMPTS, COMPLETIONS, PAD)
        for tp, group in groups.items():
            deployment = (f"fwd-{path.name}-tp{tp}", "reference")
            facts = create(group, deployment, path, trainable=False)
            assert facts["tensor_parallel"] == tp
            results = call_all(group, deployment, "forward", batch=batch)
            for result in results:  # every rank computes the full result
                assert torch.equal(torch.as_tensor(result.mask), mask)
                assert (torch.as_tensor(result.logprobs) - expected).abs().max() <= 1e-4
            with pytest.raises(ValueError, match="trainable=False"):
                call_all(group, deployment, "forward_backward", batch=batch, **GRPO)
            drop(group, deployment)


def test_rows_sharing_prompts_give_transformers_logprobs(groups, model_dir):
    """GRPO's batches repeat each prompt for its group's completions; the backend computes each
    prompt once (a packed row under a block mask, rotary embeddings at explicit positions). Its
    log-probs must still be transformers' on plain rows, at TP=1 and TP=2."""
    prompts = [PROMPTS[i % 3] for i in (0, 1, 2, 0, 1, 0, 2, 0)]
    completions = [[20 + i, 30 + (i * 7) % 20, EOS][: 1 + i % 3] for i in range(len(prompts))]
    with torch.no_grad():
        expected, mask = sequence_logprobs(hf_model(model_dir), prompts, completions, PAD)
    shared = Batch(prompts=prompts, completions=completions)
    for tp, group in groups.items():
        deployment = (f"shared-tp{tp}", "reference")
        create(group, deployment, model_dir, trainable=False)
        for result in call_all(group, deployment, "forward", batch=shared):
            assert torch.equal(torch.as_tensor(result.mask), mask)
            assert (torch.as_tensor(result.logprobs) - expected).abs().max() <= 1e-4
        drop(group, deployment)


def test_tp2_loss_and_gradients_equal_tp1(groups, batch, model_dir):
    losses, grad = {}, {}
    for tp, group in groups.items():
        deployment = (f"grads-tp{tp}", "policy")
        create(group, deployment, model_dir)
        results = call_all(group, deployment, "forward_backward", batch=batch, **GRPO)
        assert len({r.loss for r in results}) == 1  # both ranks hold the same loss
        losses[tp] = results[0]
        grad[tp] = grads(group, deployment)
        drop(group, deployment)
    assert losses[2].tokens == losses[1].tokens == TOKENS
    assert abs(losses[2].loss - losses[1].loss) <= 1e-5 * abs(losses[1].loss)
    assert losses[2].metrics.keys() == losses[1].metrics.keys()
    assert grad[2].keys() == grad[1].keys()
    for name, g in grad[1].items():
        assert (grad[2][name] - g).norm() <= 1e-5 * g.norm(), name


def test_optim_step_tp2_matches_tp1_and_the_torch_backend(groups, batch, model_dir, tmp_path):
    before = load_file(model_dir / "model.safetensors")
    after, steps = {}, {}
    for tp, group in groups.items():
        deployment = (f"step-tp{tp}", "policy")
        create(group, deployment, model_dir)
        call_all(group, deployment, "forward_backward", batch=batch, **GRPO)
        steps[tp] = call_all(group, deployment, "optim_step")
        after[tp] = weights(group, deployment)
        drop(group, deployment)

    reference = TorchBackend(rank=0, world_size=1, data_dir=tmp_path)
    deployment = ("step-torch", "policy")
    reference.create(deployment, model_dir, trainable=True, optimizer=OptimizerConfig(lr=LR))
    reference.execute(deployment, "forward_backward", {"batch": batch, **GRPO})
    torch_step = reference.execute(deployment, "optim_step", {})
    torch_after = {name: t for name, t, _ in reference.export_weights(deployment)}

    for result in steps[1] + steps[2]:
        assert result["tokens"] == TOKENS
        assert result["lr"] == LR
        assert result["grad_norm"] == pytest.approx(torch_step["grad_norm"], rel=1e-5)
    assert after[2].keys() == after[1].keys() == torch_after.keys() == before.keys()
    for name, w in after[1].items():
        delta = w - before[name]
        assert delta.abs().max() > 0.5 * LR, name  # every tensor moved
        assert (after[2][name] - w).norm() <= 1e-5 * w.norm(), name
        assert (torch_after[name] - w).norm() <= 1e-4 * w.norm(), name
        # the updates themselves agree less tightly: Adam's first step is about lr * sign(grad),
        # which turns rounding differences in near-zero gradient entries into lr-sized ones
        for other in (after[2][name], torch_after[name]):
            assert (other - before[name] - delta).norm() <= 1e-2 * delta.norm(), name


def test_checkpoint_round_trip(groups, batch, model_dir):
    tp2 = groups[2]
    deployment = ("ckpt", "policy")
    create(tp2, deployment, model_dir, optimizer=OptimizerConfig(lr=LR, warmup_steps=4))  # lr tells the step
    call_all(tp2, deployment, "forward_backward", batch=batch, **GRPO)
    call_all(tp2, deployment, "optim_step")
    saved = weights(tp2, deployment)
    paths = call_all(tp2, deployment, "save_checkpoint", tag="step1")
    path = Path(paths[0]["path"])
    assert {p.name for p in path.iterdir()} == {"rank0", "rank1"}
    assert (path / "rank1" / "optimizer.safetensors").is_file()
    assert not path.with_name("step1.tmp").exists()

    # move on, then come back: weights, moments and the step count are restored
    call_all(tp2, deployment, "forward_backward", batch=batch, **GRPO)
    second = call_all(tp2, deployment, "optim_step")[0]
    moved = weights(tp2, deployment)
    assert any(not torch.equal(moved[n], saved[n]) for n in saved)
    call_all(tp2, deployment, "load_checkpoint", tag="step1")
    restored = weights(tp2, deployment)
    assert all(torch.equal(restored[n], saved[n]) for n in saved)
    call_all(tp2, deployment, "forward_backward", batch=batch, **GRPO)
    again = call_all(tp2, deployment, "optim_step")[0]
    assert second["lr"] == LR / 2
    assert again == pytest.approx(second, rel=1e-6)
    assert all(torch.equal(w, moved[n]) for n, w in weights(tp2, deployment).items())

    # a TP=1 checkpoint does not fit a TP=2 group
    create(groups[1], deployment, model_dir)
    call_all(groups[1], deployment, "save_checkpoint", tag="tp1")
    with pytest.raises(ValueError, match="saved by 1 ranks"):
        call_all(tp2, deployment, "load_checkpoint", tag="tp1")
    with pytest.raises(FileNotFoundError):
        call_all(tp2, deployment, "load_checkpoint", tag="missing")
    for group in groups.values():
        drop(group, deployment)


def test_export_weights_gathers_to_the_hf_weights(groups, model_dir, untied_dir):
    for path, tied in ((model_dir, True), (untied_dir, False)):
        expected = load_file(path / "model.safetensors")
        if tied:
            expected.pop("lm_head.weight", None)  # exported once, as the embedding
        deployment = (f"export-{path.name}", "policy")
        create(groups[2], deployment, path)
        exported = weights(groups[2], deployment)
        assert exported.keys() == expected.keys()
        assert all(torch.equal(exported[n], t) for n, t in expected.items())
        names = ["model.norm.weight", "model.layers.1.self_attn.k_proj.bias"]
        per_rank = ray.get([r.export_weights.remote(deployment, names) for r in groups[2].ranks])
        assert [[name for name, _, _ in shards] for shards in per_rank] == [names, names]
        drop(groups[2], deployment)


def test_a_tp2_checkpoint_exports_to_a_hugging_face_folder(groups, batch, model_dir, tmp_path):
    from engine.service.artifacts import export_hf

    deployment = ("export-final", "policy")
    create(groups[2], deployment, model_dir)
    call_all(groups[2], deployment, "forward_backward", batch=batch, **GRPO)
    call_all(groups[2], deployment, "optim_step")
    trained = weights(groups[2], deployment)
    path = Path(call_all(groups[2], deployment, "save_checkpoint", tag="final")[0]["path"])
    files = export_hf(path, model_dir, tmp_path / "final")
    assert {"model.safetensors", "config.json"} <= set(files)
    exported = load_file(tmp_path / "final" / "model.safetensors")
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[n], t) for n, t in trained.items())
    loaded = hf_model(tmp_path / "final")  # transformers reads it (the tied head from the embedding)
    assert torch.equal(loaded.model.embed_tokens.weight, trained["model.embed_tokens.weight"])
    drop(groups[2], deployment)


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_llama_and_qwen3_forward_as_transformers_and_export_their_weights_at_tp1_and_tp2(groups, batch, arch, tied,
                                                                                          tmp_path):
    """Megatron builds Llama (no q, k, v biases) and Qwen3 (a per-head RMSNorm of q and k before the
    rotary embedding) from their Hugging Face folders: the same log-probs as transformers, and the
    same tensors back."""
    from tests.modelfiles import build_tiny_model

    path = build_tiny_model(tmp_path / arch, arch, tied=tied, seed=3)
    with torch.no_grad():
        expected, mask = sequence_logprobs(hf_model(path), PROMPTS, COMPLETIONS, PAD)
    stored = load_file(path / "model.safetensors")
    if tied:
        stored.pop("lm_head.weight", None)
    for tp, group in groups.items():
        deployment = (f"arch-{arch}-tp{tp}", "policy")
        create(group, deployment, path)
        for result in call_all(group, deployment, "forward", batch=batch):
            assert torch.equal(torch.as_tensor(result.mask), mask)
            assert (torch.as_tensor(result.logprobs) - expected).abs().max() <= 1e-4
        exported = weights(group, deployment)
        assert exported.keys() == stored.keys()
        assert all(torch.equal(exported[n], t) for n, t in stored.items())
        drop(group, deployment)
