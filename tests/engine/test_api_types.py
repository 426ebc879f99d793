"""The plain data that crosses the function API validates itself; ``Batch.select`` keeps rows aligned."""

import pytest
import torch

from engine.api import Batch, OptimizerConfig, Request, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n": 0}, "n must be"), ({"temperature": -0.1}, "temperature"), ({"max_tokens": 0}, "max_tokens")],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_defaults():
    params = SamplingParams()
    assert (params.n, params.temperature, params.seed) == (1, 1.0, 0)
    SamplingParams(temperature=0.0)  # greedy is allowed


@pytest.mark.parametrize("lr", [0.0, -1e-3])
def test_optimizer_config_needs_a_positive_lr(lr):
    with pytest.raises(ValueError, match="lr"):
        OptimizerConfig(lr=lr)


def test_batch_needs_matching_rows():
    with pytest.raises(ValueError, match="as many prompts as completions"):
        Batch(prompts=[[1], [2]], completions=[[3]])
    with pytest.raises(ValueError, match="at least one"):
        Batch(prompts=[], completions=[])
    assert len(Batch(prompts=[[1], [2]], completions=[[3], [4, 5]])) == 2


def test_batch_select_keeps_loss_inputs_aligned():
    batch = Batch(
        prompts=[[1], [2, 2], [3]],
        completions=[[7, 7, 7, 7], [8], [9, 9]],
        advantages=torch.tensor([0.5, -1.0, 2.0]),
        old_logprobs=torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-5.0, 0, 0, 0], [-6.0, -7.0, 0, 0]]),
        ref_logprobs=torch.arange(12, dtype=torch.float32).reshape(3, 4),
    )
    sub = batch.select([2, 1])
    assert sub.prompts == [[3], [2, 2]]
    assert sub.completions == [[9, 9], [8]]
    torch.testing.assert_close(sub.advantages, torch.tensor([2.0, -1.0]))
    # per-token inputs are trimmed to the sub-batch's own longest completion
    torch.testing.assert_close(sub.old_logprobs, torch.tensor([[-6.0, -7.0], [-5.0, 0.0]]))
    torch.testing.assert_close(sub.ref_logprobs, torch.tensor([[8.0, 9.0], [4.0, 5.0]]))
    bare = Batch(prompts=[[1], [2]], completions=[[3], [4]]).select([1])
    assert bare.advantages is None
    assert bare.old_logprobs is None
    assert bare.ref_logprobs is None


def test_request_names_its_deployment():
    request = Request(job="j", role="policy", fn="forward", payload={})
    assert request.deployment == ("j", "policy")
    assert request.estimate_s is None


def test_optimizer_schedule_warms_up_then_decays_to_zero():
    from itertools import pairwise

    cfg = OptimizerConfig(lr=1e-3, warmup_steps=4, decay_steps=20)
    rates = [cfg.lr_at(s) for s in range(20)]
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert rates[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in pairwise(rates[4:]))
    assert rates[19] == pytest.approx(0.0, abs=1e-12)
    assert OptimizerConfig(lr=1e-3).lr_at(10_000) == 1e-3  # constant without decay_steps
