"""The vLLM rollout backend through a real Ray worker group: weight swaps, log-probs, sampling seeds
and ``sync_weights`` from a torch trainer group, each checked against transformers on the same
weights.

Job A samples from the session's ``tiny-arith`` build; job B from a strongly perturbed copy of it
(same architecture and tokenizer, other weights), so the two jobs' greedy answers differ.
"""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch

from engine.api import Batch, OptimizerConfig, Request, SamplingParams
from engine.workers.sampling import sample, sequence_logprobs
from engine.workers.vllm_backend import VllmBackend, request_seed

JOB_A, JOB_B = ("vllm-a", "policy"), ("vllm-b", "policy")
PROBLEMS = ["12+7=", "3-5=", "40+1-2=", "99-99=", "8+8=", "61-7+3="]
# Longer than one KV block (32 tokens), so the prefix cache really holds blocks of these prompts.
LONG = ["1+2+3+4+5+6+7+8+9+10+11+12+13+14+15=", "90-1-2-3-4-5-6-7-8-9-10-11-12-13=",
        "11+22+33+44+55+66+77+88+99+10+20=", "5-4+3-2+1-9+8-7+6-5+4-3+2-1+55-44="]
MAX_TOKENS = 8
GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)


def _call(group, deployment, fn, **payload):
    return ray.get(group.submit(Request(*deployment, fn, payload)))


def _hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _greedy_ref(model, tok, prompts) -> list[list[int]]:
    """transformers' greedy answers, one prompt at a time (no padding in the reference)."""
    return [
        sample(model, [p], max_tokens=MAX_TOKENS, temperature=0.0, eos_id=tok.eos_token_id,
               pad_id=tok.pad_token_id, generator=None)[0][0]
        for p in prompts
    ]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model_b_dir(tiny_model_dir, tok, tmp_path_factory):
    """Job B's model: the tiny model with every matrix perturbed by half its own spread."""
    model = _hf(tiny_model_dir)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.5)
    path = tmp_path_factory.mktemp("model-b")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def vllm_group(ray_engine, plexrl_home, tiny_model_dir, model_b_dir):
    from engine.workers.group import WorkerGroup

    group = WorkerGroup.start("test-vllm-0", kind="vllm", threads=1, data_dir=plexrl_home, devices_per_rank=0.5)
    group.create(JOB_A, tiny_model_dir, trainable=False, optimizer=None)
    group.create(JOB_B, model_b_dir, trainable=False, optimizer=None)
    yield group
    group.shutdown()


def _stats(group) -> dict:
    return ray.get(group.ranks[0].stats.remote())


def test_group_serves_rollout_only(vllm_group):
    assert vllm_group.serves == {"generate", "sync_weights"}
    info = ray.get(vllm_group.ranks[0].info.remote())
    assert info["threads"] == 1  # vLLM kept the thread count the rank pinned
    stats = _stats(vllm_group)
    assert stats["engine_start_s"] > 0
    assert stats["deployments"] == sorted([JOB_A, JOB_B])


def test_greedy_after_swap_matches_transformers(vllm_group, tok, tiny_model_dir, model_b_dir):
    prompts = [tok.encode(p) for p in PROBLEMS]
    for deployment, model_dir in ((JOB_B, model_b_dir), (JOB_A, tiny_model_dir)):
        before = _stats(vllm_group)
        out = _call(vllm_group, deployment, "generate", prompts=prompts, sampling=GREEDY)
        assert [c.token_ids for c in out] == _greedy_ref(_hf(model_dir), tok, prompts)
        after = _stats(vllm_group)
        assert after["resident"] == deployment
        if before["resident"] != deployment:
            assert after["swaps"] == before["swaps"] + 1
            assert after["prefix_cache_resets"] == before["prefix_cache_resets"] + 1
            assert after["last_swap_bytes"] == sum(p.numel() * 4 for p in _hf(model_dir).parameters())
            assert 0 < after["last_swap_seconds"] < 5
    # a call for the resident deployment swaps nothing
    before = _stats(vllm_group)
    _call(vllm_group, JOB_A, "generate", prompts=prompts[:1], sampling=GREEDY)
    assert _stats(vllm_group)["swaps"] == before["swaps"]


def test_completions_follow_the_torch_conventions(vllm_group, tok):
    prompts = [tok.encode(p) for p in PROBLEMS]
    out = _call(vllm_group, JOB_A, "generate", prompts=prompts,
                sampling=SamplingParams(n=3, temperature=1.0, max_tokens=MAX_TOKENS, seed=3))
    assert [c.prompt_index for c in out] == [i for i in range(len(prompts)) for _ in range(3)]  # prompt-major
    for c in out:
        assert 1 <= len(c.token_ids) <= MAX_TOKENS
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs)
        assert tok.eos_token_id not in c.token_ids[:-1]
        assert c.token_ids[-1] == tok.eos_token_id or len(c.token_ids) == MAX_TOKENS
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    # greedy with n > 1: n copies of the one answer
    greedy = _call(vllm_group, JOB_A, "generate", prompts=prompts,
                   sampling=SamplingParams(n=2, temperature=0.0, max_tokens=MAX_TOKENS))
    assert [c.token_ids for c in greedy[::2]] == [c.token_ids for c in greedy[1::2]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_transformers_forward(vllm_group, tok, model_b_dir, temperature):
    """Sampled-token log-probs are the model's own (temperature 1) ones, whatever the temperature."""
    prompts = [tok.encode(p) for p in PROBLEMS + LONG]
    out = _call(vllm_group, JOB_B, "generate", prompts=prompts,
                sampling=SamplingParams(n=2, temperature=temperature, max_tokens=MAX_TOKENS, seed=11))
    with torch.no_grad():
        ref, mask = sequence_logprobs(_hf(model_b_dir), [prompts[c.prompt_index] for c in out],
                                      [c.token_ids for c in out], tok.pad_token_id)
    got = torch.zeros_like(ref)
    for i, c in enumerate(out):
        got[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
    diff = float(((got - ref) * mask).abs().max())
    print(f"max |vLLM - transformers| log-prob at T={temperature}: {diff:.2e}")
    assert diff < 1e-3


def test_prefix_cache_never_serves_another_jobs_blocks(vllm_group, tok, tiny_model_dir, model_b_dir):
    prompts = [tok.encode(p) for p in LONG]
    assert all(len(p) > 32 for p in prompts)
    ref_a = _greedy_ref(_hf(tiny_model_dir), tok, prompts)
    ref_b = _greedy_ref(_hf(model_b_dir), tok, prompts)
    differ = [i for i in range(len(prompts)) if ref_a[i] != ref_b[i]]
    assert differ, "the two jobs must answer these prompts differently"
    prompts = [prompts[i] for i in differ]
    ref_a, ref_b = [ref_a[i] for i in differ], [ref_b[i] for i in differ]

    def greedy(deployment):
        return [c.token_ids for c in _call(vllm_group, deployment, "generate", prompts=prompts, sampling=GREEDY)]

    assert greedy(JOB_A) == ref_a
    assert greedy(JOB_A) == ref_a  # served again, now from A's cached prefix blocks
    assert greedy(JOB_B) == ref_b  # same prompts after the swap: B's answers, not A's cached ones
    assert greedy(JOB_B) == ref_b
    assert greedy(JOB_A) == ref_a


def test_same_seed_same_samples(vllm_group, tok):
    prompts = [tok.encode(p) for p in PROBLEMS]

    def run(seed):
        sampling = SamplingParams(n=4, temperature=1.0, max_tokens=MAX_TOKENS, seed=seed)
        return _call(vllm_group, JOB_A, "generate", prompts=prompts, sampling=sampling)

    first = run(5)
    _call(vllm_group, JOB_B, "generate", prompts=prompts, sampling=GREEDY)  # a swap in between
    assert run(5) == first
    assert run(6) != first
    # the per-prompt seeds are fixed functions of the call's seed, distinct across prompts
    assert request_seed(5, 0) == request_seed(5, 0) != request_seed(5, 1)
    # identical prompts still get different samples (their seeds differ)
    same = _call(vllm_group, JOB_A, "generate", prompts=[prompts[0]] * 4,
                 sampling=SamplingParams(n=1, temperature=1.0, max_tokens=MAX_TOKENS, seed=5))
    assert len({tuple(c.token_ids) for c in same}) > 1


def test_sync_weights_from_a_torch_trainer(vllm_group, worker_group, tok, tiny_model_dir):
    job = ("vllm-sync", "policy")
    trainer = worker_group  # the session's torch group
    trainer.create(job, tiny_model_dir, trainable=True, optimizer=OptimizerConfig(lr=2e-2))
    vllm_group.create(job, tiny_model_dir, trainable=False, optimizer=None)
    prompts = [tok.encode(p) for p in PROBLEMS + LONG]
    before = _call(vllm_group, job, "generate", prompts=prompts, sampling=GREEDY)

    # a few steps of supervised updates on the trainer: push every answer towards "7" + EOS
    batch = Batch(prompts=prompts, completions=[[*tok.encode("7"), tok.eos_token_id]] * len(prompts))
    for _ in range(3):
        _call(trainer, job, "forward_backward", batch=batch, loss="cross_entropy", loss_config={})
        _call(trainer, job, "optim_step")
    _call(trainer, job, "sync_weights")  # the trainer's own rollout copy, for its reference answers

    synced = _call(vllm_group, job, "sync_weights", source=trainer.ranks)
    assert synced["bytes"] == sum(t.numel() * 4 for t in _hf(tiny_model_dir).parameters())
    assert synced["seconds"] > 0
    after = _call(vllm_group, job, "generate", prompts=prompts, sampling=GREEDY)
    expected = _call(trainer, job, "generate", prompts=prompts, sampling=GREEDY)
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the update really moved them
    # and the log-probs are the trainer's
    sampled = _call(vllm_group, job, "generate", prompts=prompts,
                    sampling=SamplingParams(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=1))
    fwd = _call(trainer, job, "forward", batch=Batch(prompts=[prompts[c.prompt_index] for c in sampled],
                                                     completions=[c.token_ids for c in sampled]))
    got = torch.zeros(fwd.logprobs.shape)
    for i, c in enumerate(sampled):
        got[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
    assert float(((got - torch.as_tensor(fwd.logprobs)) * torch.as_tensor(fwd.mask)).abs().max()) < 1e-3
    # job A, swapped back in, still has its own weights
    assert [c.token_ids for c in _call(vllm_group, JOB_A, "generate", prompts=prompts, sampling=GREEDY)] == [
        c.token_ids for c in before
    ]
    _call(vllm_group, job, "generate", prompts=prompts[:1], sampling=GREEDY)  # swap the synced job back in
    assert [c.token_ids for c in _call(vllm_group, job, "generate", prompts=prompts, sampling=GREEDY)] == [
        c.token_ids for c in expected
    ]
    ray.get([r.drop.remote(job) for r in trainer.ranks])
    ray.get([r.drop.remote(job) for r in vllm_group.ranks])


def test_another_architecture_is_refused(vllm_group, tmp_path, tok):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="another architecture"):
        vllm_group.create(("vllm-other", "policy"), tmp_path, trainable=False, optimizer=None)


def test_dropped_deployment_is_gone(vllm_group, tiny_model_dir, tok):
    job = ("vllm-drop", "policy")
    facts = vllm_group.create(job, tiny_model_dir, trainable=False, optimizer=None)
    assert facts["bytes"] == 4 * facts["params"] > 0
    ray.get([r.drop.remote(job) for r in vllm_group.ranks])
    with pytest.raises(KeyError, match="not resident"):
        _call(vllm_group, job, "generate", prompts=[tok.encode("1+1=")], sampling=GREEDY)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA a group's ranks share one tensor-parallel engine")
def test_cpu_backend_is_one_rank(tmp_path):
    with pytest.raises(ValueError, match="one rank"):
        VllmBackend(rank=0, world_size=2, data_dir=tmp_path)


def test_stop_tokens_end_samples_as_in_the_torch_sampler(vllm_group, tok, tiny_model_dir):
    """A stop token (a tool call's "]") ends a sample and stays its last token, as EOS does."""
    prompts = [tok.encode(p) for p in PROBLEMS + LONG]
    free = _greedy_ref(_hf(tiny_model_dir), tok, prompts)
    stop = next(t for answer in free for t in answer[:-1] if t != tok.eos_token_id)
    greedy = _call(vllm_group, JOB_A, "generate", prompts=prompts,
                   sampling=dataclasses.replace(GREEDY, stop_token_ids=(stop,)))
    expected = [a[: a.index(stop) + 1] if stop in a else a for a in free]
    assert [c.token_ids for c in greedy] == expected
    assert any(len(e) < len(a) for e, a in zip(expected, free, strict=True))
    sampling = SamplingParams(n=3, temperature=1.0, max_tokens=MAX_TOKENS, seed=4, stop_token_ids=(stop,))
    sampled = _call(vllm_group, JOB_A, "generate", prompts=prompts, sampling=sampling)
    for c in sampled:
        assert not {stop, tok.eos_token_id} & set(c.token_ids[:-1])
        assert c.token_ids[-1] in (stop, tok.eos_token_id) or len(c.token_ids) == MAX_TOKENS
        assert len(c.logprobs) == len(c.token_ids)
