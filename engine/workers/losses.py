"""Named, parameterised losses, implemented once and run inside workers.

Algorithm code picks a loss by name and passes a config; no algorithm-defined code runs in a
worker. Every loss takes per-token log-probs ``logp [B, T]`` with ``mask [B, T]`` and the batch's
loss inputs, and returns ``(loss, metrics)``; the loss is a token sum divided by
``token_normalizer`` (default: this batch's token count) so that gradients accumulated over several
``forward_backward`` calls add up to one mean over the optimizer step's tokens. The batch's arrays
(numpy, as they cross the API) become float32 tensors on ``logp``'s device here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.api import Batch, as_tensor

LossFn = Callable[[torch.Tensor, torch.Tensor, Batch, dict[str, Any]], tuple[torch.Tensor, dict[str, float]]]


def _normalizer(mask: torch.Tensor, config: dict[str, Any]) -> float:
    value = config.get("token_normalizer")
    return float(value) if value else float(mask.sum().clamp(min=1))


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate exp(r) - r - 1 with r = ref - logp (Schulman's k3)."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def grpo_loss(logp, mask, batch: Batch, config):
    """PPO-clip policy gradient with sequence-level advantages, optional KL to a reference.

    config: ``clip_eps`` (0.2), ``clip_eps_high`` (= clip_eps), ``dual_clip`` (0: off; c > 1 caps
    a negative-advantage token's loss at ``c * |advantage|``, so a token whose probability grew
    far past the clip range cannot produce an unbounded gradient), ``kl_coef`` (0.0; needs
    ``ref_logprobs``), ``token_normalizer``.
    """
    if batch.advantages is None:
        raise ValueError("grpo loss needs batch.advantages")
    eps_low = float(config.get("clip_eps", 0.2))
    eps_high = float(config.get("clip_eps_high", eps_low))
    kl_coef = float(config.get("kl_coef", 0.0))
    dual = float(config.get("dual_clip", 0.0))
    if dual and dual <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or 0 for off), got {dual}")
    maskf = mask.to(logp.dtype)
    old = as_tensor(batch.old_logprobs, logp.device) if batch.old_logprobs is not None else logp.detach()
    adv = as_tensor(batch.advantages, logp.device).to(logp.dtype)[:, None]
    ratio = torch.exp(logp - old)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if dual:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual * adv), per_token)
    n = maskf.sum().clamp(min=1)
    metrics = {
        "clip_frac": float(((unclipped > clipped).to(logp.dtype) * maskf).sum() / n),
        "kl_old": float((k3_kl(logp.detach(), old) * maskf).sum() / n),
    }
    if batch.ref_logprobs is not None:
        kl = k3_kl(logp, as_tensor(batch.ref_logprobs, logp.device))
        metrics["kl_ref"] = float((kl.detach() * maskf).sum() / n)
        if kl_coef:
            per_token = per_token + kl_coef * kl
    elif kl_coef:
        raise ValueError("kl_coef > 0 needs batch.ref_logprobs")
    loss = (per_token * maskf).sum() / _normalizer(mask, config)
    return loss, metrics


def cross_entropy_loss(logp, mask, batch: Batch, config):
    """Negative log-likelihood of the completion tokens (supervised fine-tuning)."""
    maskf = mask.to(logp.dtype)
    loss = -(logp * maskf).sum() / _normalizer(mask, config)
    return loss, {}


LOSSES: dict[str, LossFn] = {
    "grpo": grpo_loss,
    "ppo": grpo_loss,  # same objective; the name callers from PPO code expect
    "cross_entropy": cross_entropy_loss,
}


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}") from None
