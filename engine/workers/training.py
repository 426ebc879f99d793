"""The training functions every trainer backend serves the same way: ``forward``,
``forward_backward`` (the engine's named losses, implemented once in ``engine.losses``) and
``optim_step`` (AdamW with the job's learning-rate schedule and global-norm clipping).

A backend supplies how to get per-token log-probs of a batch (``_logprobs``) and, when its
parameters are sharded, the norm of the whole model's gradient (``_grad_norm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.api import Batch, ForwardResult, LossResult
from engine.losses import get_loss
from engine.workers.backend import Backend, Deployment
from engine.workers.checkpoint import STEPS_KEY, load_optimizer_tensors


class TrainingBackend(Backend):
    """Deployment states live in ``self.states``; each has ``model``, ``optimizer``,
    ``optimizer_config``, ``pending_tokens`` and ``steps``; ``self.device`` is the rank's device."""

    states: dict[Deployment, Any]
    device: torch.device

    def _logprobs(self, state, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _grad_norm(self, params: list[torch.Tensor]) -> torch.Tensor:
        """2-norm of the gradient of ``params`` (all of the model on this rank)."""
        if not params:
            return torch.zeros(())
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))

    # -- dispatch ------------------------------------------------------------------------------
    def drop(self, deployment):
        self.states.pop(deployment, None)

    def execute(self, deployment, fn, payload):
        state = self.states.get(deployment)
        if state is None:
            raise KeyError(f"deployment {deployment} is not resident on this worker")
        if fn not in self.serves:
            raise ValueError(f"the {type(self).__name__} does not serve {fn!r}")
        return getattr(self, f"_{fn}")(deployment, state, **payload)

    def _restore_optimizer(self, state, folder: Path) -> None:
        """After a checkpoint's weights are loaded: drop gradients accumulated before the load and
        restore the optimizer's moments and step count (the schedule resumes where it was)."""
        if state.optimizer is None:
            return
        state.optimizer.zero_grad(set_to_none=True)
        state.pending_tokens = 0
        if (folder / "optimizer.safetensors").is_file():
            tensors = load_file(folder / "optimizer.safetensors", device=str(self.device))
            state.steps = int(tensors.pop(STEPS_KEY, torch.tensor(0)))
            load_optimizer_tensors(state.model, state.optimizer, tensors)

    # -- API functions -------------------------------------------------------------------------
    def _forward(self, deployment, state, *, batch: Batch):
        with torch.no_grad():
            logp, mask = self._logprobs(state, batch)
        return ForwardResult(logprobs=logp, mask=mask)

    def _require_trainable(self, deployment, state) -> torch.optim.Optimizer:
        if state.optimizer is None:
            raise ValueError(f"deployment {deployment} was created with trainable=False")
        return state.optimizer

    def _forward_backward(self, deployment, state, *, batch: Batch, loss: str, loss_config: dict):
        self._require_trainable(deployment, state)
        loss_fn = get_loss(loss)
        logp, mask = self._logprobs(state, batch)
        value, metrics = loss_fn(logp, mask, batch, loss_config)
        value.backward()
        tokens = int(mask.sum())
        state.pending_tokens += tokens
        return LossResult(loss=value.item(), tokens=tokens, metrics=metrics)

    def _optim_step(self, deployment, state):
        opt = self._require_trainable(deployment, state)
        params = [p for p in state.model.parameters() if p.grad is not None]
        norm = self._grad_norm(params)
        clip = state.optimizer_config.grad_clip
        if clip > 0:  # scale every gradient by min(1, clip / norm), as torch's clip_grad_norm_
            coef = torch.clamp(clip / (norm + 1e-6), max=1.0)
            for p in params:
                p.grad.mul_(coef.to(p.grad.device))
        lr = state.optimizer_config.lr_at(state.steps)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        state.steps += 1
        opt.zero_grad(set_to_none=True)
        tokens, state.pending_tokens = state.pending_tokens, 0
        return {"grad_norm": float(norm), "tokens": tokens, "lr": lr}
