"""``sync_weights`` across layouts, through the router: a policy trained on Megatron TP=2 is pulled
shard by shard into a vLLM engine and into a torch rollout copy, and both then sample exactly what
transformers samples on the trained weights."""

from __future__ import annotations

import pytest
import ray
import torch

from engine.api import Batch, OptimizerConfig, SamplingParams
from engine.scheduler.placement import Placement
from engine.scheduler.router import Router
from engine.state.layout import gather_shards
from engine.workers.sampling import sample

PROBLEMS = ["12+7=", "3-5=", "40+1-2=", "99-99=", "8+8=", "61-7+3=", "25+25=", "9-18+2="]
MAX_TOKENS = 8
# device slots of each rank: with the session's torch group (one slot) this module's groups and the
# vLLM group of each architecture (one at a time) fit the session's two
DEVICES = 0.125


@pytest.fixture(scope="module")
def groups(ray_engine, plexrl_home, tiny_model_dir):
    """A Megatron TP=2 trainer group, a vLLM rollout group and a torch group, for this module."""
    from engine.workers.group import WorkerGroup

    started = {
        "megatron": WorkerGroup.start("sync-megatron-tp2", "megatron", world_size=2, threads=1,
                                      data_dir=plexrl_home, devices_per_rank=DEVICES),
        "vllm": WorkerGroup.start("sync-vllm", "vllm", threads=1, data_dir=plexrl_home, devices_per_rank=DEVICES),
        "torch": WorkerGroup.start("sync-torch", "torch", threads=1, data_dir=plexrl_home, devices_per_rank=DEVICES),
    }
    yield started
    for group in started.values():
        group.shutdown()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _train(router: Router, job: str, tok, steps: int = 3) -> None:
    """A few large steps that change the greedy answers (advantage +1 on a fixed wrong answer)."""
    prompts = [tok.encode(p) for p in PROBLEMS]
    wrong = [[*tok.encode("77"), tok.eos_token_id]] * len(prompts)
    batch = Batch(prompts=prompts, completions=wrong, advantages=torch.ones(len(prompts)))
    for _ in range(steps):
        router.call(job, "policy", "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}})
        router.call(job, "policy", "optim_step", {})
    # no .result() on purpose: sync_weights must still see every step submitted before it


def _trainer_weights(group, deployment) -> dict[str, torch.Tensor]:
    parts = ray.get([r.export_weights.remote(deployment, None) for r in group.ranks])
    by_name: dict[str, list] = {}
    for part in parts:
        for name, t, spec in part:
            by_name.setdefault(name, []).append((t, spec))
    return {name: gather_shards(shards) for name, shards in by_name.items()}


def _transformers_greedy(model_dir, weights, tok) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}
    return [
        sample(model, [tok.encode(p)], max_tokens=MAX_TOKENS, temperature=0.0, eos_id=tok.eos_token_id,
               pad_id=tok.pad_token_id, generator=None)[0][0]
        for p in PROBLEMS
    ]


@pytest.mark.parametrize("rollout", ["vllm", "torch"])
def test_megatron_tp2_policy_syncs_into_the_rollout_group(groups, rollout, tiny_model_dir, tok):
    job = f"sync-{rollout}"
    router = Router([groups["megatron"], groups[rollout]])
    info = router.create(job, "policy", tiny_model_dir, trainable=True, optimizer=OptimizerConfig(lr=3e-2))
    assert router.placement[(job, "policy")] == Placement(groups["megatron"].name, groups[rollout].name)
    assert info["rollout_group"] == groups[rollout].name

    prompts = [tok.encode(p) for p in PROBLEMS]
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)
    before = [c.token_ids for c in router.call(job, "policy", "generate", {"prompts": prompts, "sampling": greedy})
              .result()]
    _train(router, job, tok)
    synced = router.call(job, "policy", "sync_weights", {}).result()
    after = [c.token_ids for c in router.call(job, "policy", "generate", {"prompts": prompts, "sampling": greedy})
             .result()]

    trained = _trainer_weights(groups["megatron"], (job, "policy"))
    assert after == _transformers_greedy(tiny_model_dir, trained, tok)
    assert after != before  # the steps changed the answers, so equality above is not the base's
    assert synced["bytes"] == sum(t.numel() * t.element_size() for t in trained.values())
    assert synced["seconds"] > 0


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen3", True)])
def test_llama_and_qwen3_policies_sync_from_megatron_tp2_into_vllm(groups, plexrl_home, tmp_path, arch, tied):
    """Beyond Qwen2: a vLLM engine of the architecture's own (an engine serves one model
    configuration) samples what transformers samples, before and after a Megatron TP=2 policy
    trained a few steps and synced."""
    from transformers import AutoTokenizer

    from engine.workers.group import WorkerGroup
    from tests.modelfiles import build_tiny_model

    model_dir = build_tiny_model(tmp_path / arch, arch, tied=tied, seed=4)
    tok = AutoTokenizer.from_pretrained(model_dir)
    vllm = WorkerGroup.start(f"sync-vllm-{arch}", "vllm", threads=1, data_dir=plexrl_home, devices_per_rank=DEVICES)
    try:
        job = f"sync-{arch}"
        router = Router([groups["megatron"], vllm])
        router.create(job, "policy", model_dir, trainable=True, optimizer=OptimizerConfig(lr=3e-2))
        prompts = [tok.encode(p) for p in PROBLEMS]
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)

        def generate() -> list[list[int]]:
            answer = router.call(job, "policy", "generate", {"prompts": prompts, "sampling": greedy}).result()
            return [c.token_ids for c in answer]

        before = generate()
        assert before == _transformers_greedy(model_dir, _trainer_weights(groups["megatron"], (job, "policy")), tok)
        _train(router, job, tok)
        router.call(job, "policy", "sync_weights", {}).result()
        after = generate()
        assert after == _transformers_greedy(model_dir, _trainer_weights(groups["megatron"], (job, "policy")), tok)
        assert after != before
    finally:
        vllm.shutdown()
