"""The named losses (``grpo`` / ``ppo`` clipped objective, ``cross_entropy``) on hand-made tensors.

The PPO-clip table (clip_eps 0.2, so the ratio is clipped to [0.8, 1.2]), per token, is
``-min(r * A, clip(r) * A)``:

    ratio   A = +1              A = -1
    1.1     -1.1 (inside)       +1.1 (inside)
    1.5     -1.2 (clipped)      +1.5 (not clipped: pessimistic side)
    0.5     -0.5 (not clipped)  +0.8 (clipped)

Sum 0.6 over 6 tokens, 2 of them clipped.
"""

import math

import pytest
import torch

from engine.api import Batch
from engine.workers.losses import LOSSES, cross_entropy_loss, get_loss, grpo_loss, k3_kl

RATIOS = [1.1, 1.5, 0.5]


def _batch(advantages, old=None, ref=None, rows=2, cols=3) -> Batch:
    return Batch(
        prompts=[[1]] * rows,
        completions=[[2] * cols] * rows,
        advantages=torch.tensor(advantages, dtype=torch.float32),
        old_logprobs=old,
        ref_logprobs=ref,
    )


def _table():
    """logp (requires grad), old log-probs, mask and batch for the module docstring's table."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.3, -2.2]], dtype=torch.float64)
    log_ratio = torch.log(torch.tensor([RATIOS, RATIOS], dtype=torch.float64))
    logp = (old + log_ratio).clone().requires_grad_(True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    return logp, old, mask, _batch([1.0, -1.0], old=old)


def test_clipped_objective_by_hand():
    logp, _, mask, batch = _table()
    loss, metrics = grpo_loss(logp, mask, batch, {"clip_eps": 0.2})
    assert loss.item() == pytest.approx(0.6 / 6, abs=1e-12)
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    # k3(logp, old) per token is 1/r - log(1/r) - 1 = 1/r + log(r) - 1
    k3 = [1 / r + math.log(r) - 1 for r in RATIOS]
    assert metrics["kl_old"] == pytest.approx(sum(k3) / 3, rel=1e-9)
    assert "kl_ref" not in metrics


def test_clipped_tokens_get_no_gradient():
    logp, _, mask, batch = _table()
    loss, _ = grpo_loss(logp, mask, batch, {"clip_eps": 0.2})
    loss.backward()
    # d(-r * A / N) / d logp = -A * r / N where the unclipped term is the minimum, else 0
    expected = torch.tensor([[-1.1, 0.0, -0.5], [1.1, 1.5, 0.0]], dtype=torch.float64) / 6
    torch.testing.assert_close(logp.grad, expected, rtol=1e-12, atol=1e-12)


def test_asymmetric_clip_high():
    logp, _, mask, batch = _table()
    # ratio range [0.8, 1.6]: 1.5 is no longer clipped for A = +1
    loss, metrics = grpo_loss(logp, mask, batch, {"clip_eps": 0.2, "clip_eps_high": 0.6})
    assert loss.item() == pytest.approx((-1.1 - 1.5 - 0.5 + 1.1 + 1.5 + 0.8) / 6, abs=1e-12)
    assert metrics["clip_frac"] == pytest.approx(1 / 6)


def test_dual_clip_caps_negative_advantage_tokens():
    logp, _, mask, batch = _table()
    # c = 1.3 caps the A = -1 row at 1.3: ratio 1.5 (loss 1.5) becomes 1.3 with no gradient
    loss, _ = grpo_loss(logp, mask, batch, {"clip_eps": 0.2, "dual_clip": 1.3})
    assert loss.item() == pytest.approx((-1.1 - 1.2 - 0.5 + 1.1 + 1.3 + 0.8) / 6, abs=1e-12)
    loss.backward()
    assert logp.grad[1, 1].item() == 0.0
    assert logp.grad[0, 1].item() == 0.0  # A = +1 is untouched (clipped as before)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        grpo_loss(logp, mask, batch, {"dual_clip": 0.5})


def test_padded_tokens_are_masked_out():
    logp, old, mask, batch = _table()
    mask[1, 2] = False
    with torch.no_grad():
        logp[1, 2] = old[1, 2] + 40.0  # a wild ratio at a padded position must not count
    loss, metrics = grpo_loss(logp, mask, batch, {})
    assert loss.item() == pytest.approx((0.6 - 0.8) / 5, abs=1e-12)
    assert metrics["clip_frac"] == pytest.approx(1 / 5)
    loss.backward()
    assert logp.grad[1, 2] == 0


def test_token_normalizer_replaces_the_token_count():
    logp, _, mask, batch = _table()
    loss, metrics = grpo_loss(logp, mask, batch, {"token_normalizer": 10})
    assert loss.item() == pytest.approx(0.6 / 10, abs=1e-12)
    assert metrics["clip_frac"] == pytest.approx(2 / 6)  # metrics stay means over this batch


def test_split_batches_with_a_shared_normalizer_add_up_to_the_full_loss():
    logp, _, mask, batch = _table()
    full, _ = grpo_loss(logp, mask, batch, {})
    parts = [grpo_loss(logp[[i]], mask[[i]], batch.select([i]), {"token_normalizer": 6})[0] for i in range(2)]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-12)


def test_without_old_logprobs_the_ratio_is_one():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    batch = _batch([2.0, -1.0], cols=2)
    loss, metrics = grpo_loss(logp, mask, batch, {})
    # -(2 + 2 - 1) / 3; gradient -A / N per unmasked token
    assert loss.item() == pytest.approx(-1.0)
    assert metrics == {"clip_frac": 0.0, "kl_old": 0.0}
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))


def test_kl_penalty_k3():
    logp, old, mask, batch = _table()
    policy_only, _ = grpo_loss(logp, mask, batch, {})
    # r = ref - logp per column: log 2, 0, -log 2 -> k3 = 1 - log 2, 0, log 2 - 1/2
    shift = torch.tensor([math.log(2), 0.0, -math.log(2)], dtype=torch.float64)
    ref = logp.detach() + shift
    batch = _batch([1.0, -1.0], old=old, ref=ref)
    k3_mean = ((1 - math.log(2)) + 0 + (math.log(2) - 0.5)) / 3
    loss, metrics = grpo_loss(logp, mask, batch, {"kl_coef": 0.1})
    assert metrics["kl_ref"] == pytest.approx(k3_mean, rel=1e-9)
    assert loss.item() == pytest.approx(policy_only.item() + 0.1 * k3_mean, rel=1e-9)
    # the reference's log-probs alone are reported, not added
    loss0, metrics0 = grpo_loss(logp, mask, batch, {"kl_coef": 0.0})
    assert loss0.item() == pytest.approx(policy_only.item(), abs=1e-12)
    assert metrics0["kl_ref"] == pytest.approx(k3_mean, rel=1e-9)


def test_kl_penalty_respects_the_mask():
    logp, old, mask, _ = _table()
    ref = logp.detach() + math.log(2)  # k3 = 1 - log 2 on every token
    mask[0, 1:] = False
    loss, metrics = grpo_loss(logp, mask, _batch([0.0, 0.0], old=old, ref=ref), {"kl_coef": 1.0})
    assert metrics["kl_ref"] == pytest.approx(1 - math.log(2), rel=1e-9)
    assert loss.item() == pytest.approx(1 - math.log(2), rel=1e-9)  # advantages 0: the KL term only


def test_k3_estimator():
    logp = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    ref = torch.tensor([-1.0, -1.0 + math.log(2), -1.0 - math.log(2)], dtype=torch.float64)
    torch.testing.assert_close(
        k3_kl(logp, ref),
        torch.tensor([0.0, 1 - math.log(2), math.log(2) - 0.5], dtype=torch.float64),
    )


def test_kl_coef_without_reference_raises():
    logp, _, mask, batch = _table()
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logp, mask, batch, {"kl_coef": 0.1})


def test_grpo_needs_advantages():
    batch = Batch(prompts=[[1]], completions=[[2]])
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), batch, {})


def test_cross_entropy_is_the_masked_mean_nll():
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -100.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    batch = Batch(prompts=[[1], [1]], completions=[[2, 3], [2]])
    loss, metrics = cross_entropy_loss(logp, mask, batch, {})
    assert loss.item() == pytest.approx(2.0)
    assert metrics == {}
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3], [-1 / 3, 0.0]]))
    loss6, _ = cross_entropy_loss(logp, mask, batch, {"token_normalizer": 6})
    assert loss6.item() == pytest.approx(1.0)


def test_all_masked_batch_is_zero_not_nan():
    logp = torch.full((1, 2), -1.0)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    batch = _batch([1.0], rows=1, cols=2)
    assert cross_entropy_loss(logp, mask, batch, {})[0].item() == 0.0
    loss, metrics = grpo_loss(logp, mask, batch, {})
    assert loss.item() == 0.0
    assert metrics["clip_frac"] == 0.0


def test_loss_registry():
    assert get_loss("grpo") is grpo_loss
    assert get_loss("ppo") is grpo_loss
    assert get_loss("cross_entropy") is cross_entropy_loss
    assert set(LOSSES) == {"grpo", "ppo", "cross_entropy"}
    with pytest.raises(ValueError, match="unknown loss 'nope'; known: cross_entropy, grpo, ppo"):
        get_loss("nope")
