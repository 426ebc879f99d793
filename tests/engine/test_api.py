"""Every function of the API, through a real worker group on Ray (client -> router -> WPG -> backend).

The model is the session's 250-step ``tiny-arith`` build: weak, but a real checkpoint with a real
tokenizer, which is all these plumbing tests need.
"""

import os

import numpy as np
import pytest
import ray
import torch
from safetensors.torch import load_file

from engine.api import Request
from engine.client import Batch, Completion, ForwardResult, LossResult, ModelHandle, OptimizerConfig, SamplingParams
from engine.errors import ModelNotFound, SpecError
from engine.scheduler.placement import Placement

PROBLEMS = ["12+7=", "3-5=", "40+1-2=", "99-99="]
GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=6)


def _policy(client, job: str, lr: float = 1e-3) -> ModelHandle:
    return client.create_model(job, "policy", "tiny-arith", trainable=True, optimizer_config=OptimizerConfig(lr=lr))


def _prompts(client, handle) -> list[list[int]]:
    tok = client.tokenizer(handle)
    return [tok.encode(p) for p in PROBLEMS]


def _batch(prompts, completions: list[Completion]) -> Batch:
    return Batch(prompts=[prompts[c.prompt_index] for c in completions], completions=[c.token_ids for c in completions])


def _padded(rows: list[list[float]]) -> torch.Tensor:
    out = torch.zeros(len(rows), max(len(r) for r in rows))
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def _sft_batch(client, handle) -> Batch:
    """Each problem with its right answer and EOS: a cross-entropy batch that moves the weights."""
    tok = client.tokenizer(handle)
    answers = [str(eval(p[:-1], {"__builtins__": {}})) for p in PROBLEMS]  # noqa: S307 - constants above
    return Batch(
        prompts=[tok.encode(p) for p in PROBLEMS],
        completions=[[*tok.encode(a), tok.eos_token_id] for a in answers],
    )


def _logprobs(handle, batch: Batch) -> torch.Tensor:
    return torch.as_tensor(handle.forward(batch).result().logprobs)


def _train_step(handle, batch: Batch) -> dict:
    handle.forward_backward(batch, "cross_entropy")
    return handle.optim_step().result()


# --- create_model -------------------------------------------------------------------------------


def test_create_model(client, router, job, tiny_model_dir):
    policy = _policy(client, job)
    reference = client.create_model(job, "reference", "tiny-arith")
    assert (policy.job, policy.role) == (job, "policy")
    assert policy.model_dir == reference.model_dir == tiny_model_dir.resolve()
    assert router.placement == {
        (job, "policy"): Placement("test-torch-0", "test-torch-0"),  # one torch group serves both sides
        (job, "reference"): Placement("test-torch-0"),
    }
    # a folder names the same model as the preset does
    by_path = client.create_model(f"{job}-path", "reference", str(tiny_model_dir))
    assert by_path.model_dir == tiny_model_dir.resolve()
    tok = client.tokenizer(policy)
    assert tok is client.tokenizer("tiny-arith")  # loaded once per folder
    assert tok.decode(tok.encode("12+7=")) == "12+7="


def test_router_create_reports_the_state(router, job, tiny_model_dir):
    info = router.create(job, "policy", tiny_model_dir, trainable=True, optimizer=None)
    assert info["group"] == "test-torch-0"
    assert info["params"] > 0
    assert info["bytes"] == 4 * info["params"]
    with pytest.raises(ValueError, match="already exists"):
        router.create(job, "policy", tiny_model_dir, trainable=True, optimizer=None)


def test_create_model_rejects_bad_input(client, job):
    with pytest.raises(SpecError) as info:
        client.create_model(job, "critic", "tiny-arith")
    assert info.value.field == "role"
    with pytest.raises(ModelNotFound, match="no such preset"):
        client.create_model(job, "policy", "/nonexistent/model")
    _policy(client, job)
    with pytest.raises(ValueError, match="already exists"):
        _policy(client, job)


# --- generate and forward -----------------------------------------------------------------------


def test_generate(client, job):
    policy = _policy(client, job)
    tok = client.tokenizer(policy)
    prompts = _prompts(client, policy)
    sampling = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=7)
    out = policy.generate(prompts, sampling).result()
    assert len(out) == 3 * len(prompts)
    assert [c.prompt_index for c in out] == [i for i in range(len(prompts)) for _ in range(3)]  # prompt-major
    for c in out:
        assert isinstance(c, Completion)
        assert 1 <= len(c.token_ids) <= 6
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs)
        assert tok.eos_token_id not in c.token_ids[:-1]
        assert c.token_ids[-1] == tok.eos_token_id or len(c.token_ids) == 6
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert policy.generate(prompts, sampling).result() == out  # same seed, same samples
    other = policy.generate(prompts, SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=8)).result()
    assert other != out


def test_generate_greedy(client, job):
    policy = _policy(client, job)
    prompts = _prompts(client, policy)
    out = policy.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=6, seed=1)).result()
    for i in range(len(prompts)):
        first, second = out[2 * i], out[2 * i + 1]
        assert first.prompt_index == second.prompt_index == i
        assert (first.token_ids, first.text, first.logprobs) == (second.token_ids, second.text, second.logprobs)
    again = policy.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=6, seed=2)).result()
    assert again == out  # greedy ignores the seed
    # a prompt's greedy answer does not depend on the other prompts of the call (left padding)
    alone = policy.generate([prompts[1]], GREEDY).result()[0]
    assert alone.token_ids == out[2].token_ids
    assert alone.logprobs == pytest.approx(out[2].logprobs, abs=1e-5)


def test_forward_matches_generate(client, job):
    policy = _policy(client, job)
    prompts = _prompts(client, policy)
    out = policy.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=3)).result()
    result = policy.forward(_batch(prompts, out)).result()
    assert isinstance(result, ForwardResult)
    lengths = [len(c.token_ids) for c in out]
    assert result.logprobs.shape == result.mask.shape == (len(out), max(lengths))
    # plain arrays cross the API (a job's driver needs no torch)
    assert result.logprobs.dtype == np.float32
    assert result.mask.dtype == np.bool_
    assert result.mask.sum(axis=1).tolist() == lengths
    torch.testing.assert_close(torch.as_tensor(result.logprobs), _padded([c.logprobs for c in out]), atol=1e-4, rtol=0)


# --- forward_backward and optim_step ------------------------------------------------------------


def test_forward_backward_returns_the_loss(client, job):
    policy = _policy(client, job)
    batch = _sft_batch(client, policy)
    result = policy.forward_backward(batch, "cross_entropy").result()
    assert isinstance(result, LossResult)
    assert result.tokens == sum(len(c) for c in batch.completions)
    logp = _logprobs(policy, batch)  # the loss is the mean NLL of the same log-probs forward sees
    assert result.loss == pytest.approx(-logp.sum().item() / result.tokens, rel=1e-5)
    assert result.metrics == {}


def test_forward_backward_grpo_sees_forwards_logprobs(client, job):
    policy = _policy(client, job)
    prompts = _prompts(client, policy)
    out = policy.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=5)).result()
    batch = _batch(prompts, out)
    old = _logprobs(policy, batch)
    advantages = torch.tensor([1.0, -1.0] * len(prompts))
    batch = Batch(batch.prompts, batch.completions, advantages=advantages, old_logprobs=old, ref_logprobs=old)
    result = policy.forward_backward(batch, "grpo", {"clip_eps": 0.2, "kl_coef": 0.05}).result()
    # the trainer's log-probs equal the old-policy ones: ratio 1, nothing clipped, no KL
    assert result.metrics["clip_frac"] == 0.0
    assert result.metrics["kl_old"] == pytest.approx(0.0, abs=1e-6)
    assert result.metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    policy.optim_step().result()


def test_gradients_accumulate_until_optim_step(client, job):
    split = _policy(client, f"{job}-split")
    joint = _policy(client, f"{job}-joint")
    batch = _sft_batch(client, split)
    total = sum(len(c) for c in batch.completions)
    first = split.forward_backward(batch.select([0, 1]), "cross_entropy", {"token_normalizer": total})
    second = split.forward_backward(batch.select([2, 3]), "cross_entropy", {"token_normalizer": total})
    split_step = split.optim_step().result()
    joint.forward_backward(batch, "cross_entropy")
    joint_step = joint.optim_step().result()
    assert split_step["tokens"] == first.result().tokens + second.result().tokens == total
    assert joint_step["tokens"] == total
    # two halves with a shared normaliser are one full batch: the same gradient, the same update
    assert split_step["grad_norm"] == pytest.approx(joint_step["grad_norm"], rel=1e-5)
    torch.testing.assert_close(_logprobs(split, batch), _logprobs(joint, batch), atol=1e-5, rtol=0)
    # optim_step cleared them: the next one has nothing to apply
    before = _logprobs(split, batch)
    assert split.optim_step().result()["tokens"] == 0
    torch.testing.assert_close(_logprobs(split, batch), before, atol=0, rtol=0)


def test_optim_step_changes_the_weights(client, job):
    # A small step: Adam's first step moves every weight by about lr, and a first-order gain in
    # likelihood is only guaranteed for steps small against the model's curvature.
    policy = _policy(client, job, lr=1e-4)
    batch = _sft_batch(client, policy)
    # futures are submitted back to back and run in order: the last forward sees the update
    before = policy.forward(batch)
    fb = policy.forward_backward(batch, "cross_entropy")
    step = policy.optim_step()
    after = policy.forward(batch)
    before, after = torch.as_tensor(before.result().logprobs), torch.as_tensor(after.result().logprobs)
    assert fb.result().loss > 0
    assert step.result()["grad_norm"] > 0
    assert (after - before).abs().max() > 1e-3
    assert after.sum() > before.sum()  # a supervised step raises the log-likelihood of its targets


def test_reference_is_frozen(client, job):
    policy = _policy(client, job)
    reference = client.create_model(job, "reference", "tiny-arith")
    batch = _sft_batch(client, policy)
    torch.testing.assert_close(_logprobs(reference, batch), _logprobs(policy, batch), atol=0, rtol=0)
    with pytest.raises(ValueError, match="trainable=False"):
        reference.forward_backward(batch, "cross_entropy").result()
    with pytest.raises(ValueError, match="trainable=False"):
        reference.optim_step().result()
    # policy and reference of one job are separate states
    _train_step(policy, batch)
    assert not torch.equal(_logprobs(reference, batch), _logprobs(policy, batch))


# --- sync_weights -------------------------------------------------------------------------------


def test_generate_uses_the_synced_weights_only(client, job):
    policy = _policy(client, job)
    prompts = _prompts(client, policy)
    before = policy.generate(prompts, GREEDY).result()
    _train_step(policy, _sft_batch(client, policy))

    stale = policy.generate(prompts, GREEDY).result()
    assert stale == before  # tokens and log-probs: still the old weights
    trainer = _logprobs(policy, _batch(prompts, before))
    assert (trainer - _padded([c.logprobs for c in before])).abs().max() > 1e-3

    synced = policy.sync_weights().result()
    assert synced["bytes"] > 0
    assert synced["seconds"] >= 0
    fresh = policy.generate(prompts, GREEDY).result()
    assert fresh != before
    torch.testing.assert_close(
        _logprobs(policy, _batch(prompts, fresh)), _padded([c.logprobs for c in fresh]), atol=1e-4, rtol=0
    )


# --- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_restores_weights_and_optimizer(client, job, plexrl_home):
    policy = _policy(client, job)
    batch = _sft_batch(client, policy)
    prompts = _prompts(client, policy)
    _train_step(policy, batch)  # the optimizer has moments to save
    saved = policy.save_checkpoint("a").result()
    assert saved["path"] == str(plexrl_home / "checkpoints" / job / "policy" / "a")
    at_save = _logprobs(policy, batch)

    _train_step(policy, batch)
    after_one = _logprobs(policy, batch)
    first = policy.save_checkpoint("first").result()["path"]
    assert not torch.equal(after_one, at_save)

    assert policy.load_checkpoint("a").result()["path"] == saved["path"]
    torch.testing.assert_close(_logprobs(policy, batch), at_save, atol=0, rtol=0)
    # loading also makes the restored weights the rollout weights
    out = policy.generate(prompts, GREEDY).result()
    torch.testing.assert_close(_logprobs(policy, _batch(prompts, out)), _padded([c.logprobs for c in out]),
                               atol=1e-4, rtol=0)

    # the same update from the restored state (weights and Adam moments) lands on the same weights
    _train_step(policy, batch)
    torch.testing.assert_close(_logprobs(policy, batch), after_one, atol=0, rtol=0)
    second = policy.save_checkpoint("second").result()["path"]
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(os.path.join(first, name)), load_file(os.path.join(second, name))
        assert a.keys() == b.keys()
        assert a
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)


def test_checkpoint_tag_can_be_overwritten_and_must_exist(client, job):
    policy = _policy(client, job)
    batch = _sft_batch(client, policy)
    policy.save_checkpoint("latest").result()
    _train_step(policy, batch)
    policy.save_checkpoint("latest").result()
    now = _logprobs(policy, batch)
    _train_step(policy, batch)
    policy.load_checkpoint("latest").result()
    torch.testing.assert_close(_logprobs(policy, batch), now, atol=0, rtol=0)
    with pytest.raises(FileNotFoundError, match="no checkpoint 'missing'"):
        policy.load_checkpoint("missing").result()


# --- errors, noop and the worker itself ---------------------------------------------------------


def test_unknown_deployment_raises(router, job, tiny_model_dir, worker_group):
    with pytest.raises(KeyError, match="call create_model first"):
        ModelHandle(router, job, "policy", tiny_model_dir).generate([[3]], GREEDY)
    with pytest.raises(KeyError, match="call create_model first"):
        router.call("ghost-job", "reference", "forward", {})
    # and a worker asked directly for a state it does not hold says so
    request = Request(job="ghost-job", role="policy", fn="forward", payload={})
    with pytest.raises(KeyError, match="not resident"):
        ray.get(worker_group.submit(request))


def test_worker_errors_reach_the_caller_and_the_worker_survives(client, router, job):
    policy = _policy(client, job)
    batch = _sft_batch(client, policy)
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        policy.forward_backward(batch, "nope").result()
    with pytest.raises(ValueError, match=r"kl_coef > 0 needs batch\.ref_logprobs"):
        policy.forward_backward(Batch(batch.prompts, batch.completions, advantages=torch.zeros(4)), "grpo",
                                {"kl_coef": 0.1}).result()
    with pytest.raises(ValueError, match="does not serve 'launch'"):
        router.call(job, "policy", "launch", {})
    assert router.call(job, "policy", "noop", {}).result() is None
    assert _train_step(policy, batch)["tokens"] == sum(len(c) for c in batch.completions)


def test_noop(client, router, job):
    _policy(client, job)
    future = router.call(job, "policy", "noop", {})
    assert future.result(timeout=60) is None
    assert future.done()
    assert future.request == Request(job=job, role="policy", fn="noop", payload={})


def test_worker_rank_info(worker_group, worker_threads):
    info = ray.get(worker_group.ranks[0].info.remote())
    assert info["threads"] == worker_threads
    assert info["rank"] == 0
    assert info["pid"] != os.getpid()  # a process of its own
    assert worker_group.serves == {
        "generate", "forward", "forward_backward", "optim_step", "sync_weights", "save_checkpoint", "load_checkpoint",
    }
