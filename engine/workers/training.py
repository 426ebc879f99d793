"""The training functions every trainer backend serves the same way: ``forward``,
``forward_backward`` (the engine's named losses, implemented once in ``engine.workers.losses``) and
``optim_step`` (AdamW with the job's learning-rate schedule and global-norm clipping).

A backend supplies how to get per-token log-probs of a batch (``_logprobs``) and, when its
parameters are sharded, the norm of the whole model's gradient (``_grad_norm``).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engine.api import Batch, ForwardResult, LossResult
from engine.state.layout import WHOLE
from engine.workers.backend import READ_ONLY, Backend, Deployment
from engine.workers.checkpoint import STEPS_KEY, load_optimizer_tensors
from engine.workers.losses import get_loss

StateTensors = dict[str, dict[tuple[str, Any], torch.Tensor]]  # model id -> (name, shard) -> tensor


def base_model_id(model_dir: Path) -> str:
    """The StateManager id of a base model folder (its resolved path: one id per folder)."""
    path = str(Path(model_dir).resolve())
    return "base:" + hashlib.sha256(path.encode()).hexdigest()[:16]


def register_base(client, model_dir: Path) -> tuple[str, dict]:
    """Register a base model folder in the StateManager (idempotent): its id and ``{key: meta}``."""
    base = base_model_id(model_dir)
    client.call("register_model", base, str(model_dir))
    return base, client.call("keys", base)


def fork_base(client, base: str, model: str) -> None:
    """``model`` starts as the base's state: its keys point at the base's blobs (nothing is copied);
    a stale state of a re-created deployment under that id is dropped first."""
    if client.call("has_model", model):
        client.call("drop", model)
    client.call("fork", base, model)


def free_parameters(module: torch.nn.Module) -> None:
    """Drop a module's parameter storage and gradients (the parameters stay, empty, to refill)."""
    for p in module.parameters():
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        p.grad = None


class TrainingBackend(Backend):
    """Deployment states live in ``self.states``; each has ``model``, ``optimizer``,
    ``optimizer_config``, ``pending_tokens``, ``steps`` and ``res`` (a ``Residency``);
    ``self.device`` is the rank's device.

    Swapping: a backend says which tensors make up a deployment's state under canonical keys
    (``_export_state``), how to put them back (``_import_state``) and how to free them
    (``_release``); moving them through the StateManager is done here, once for every backend.
    """

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
        self._forget(deployment)

    def execute(self, deployment, fn, payload):
        state = self.states.get(deployment)
        if state is None:
            raise KeyError(f"deployment {deployment} is not resident on this worker")
        if fn not in self.serves:
            raise ValueError(f"the {type(self).__name__} does not serve {fn!r}")
        if not state.res.resident:
            raise RuntimeError(f"deployment {deployment} is swapped out; swap it in first")
        if fn not in READ_ONLY:
            state.res.dirty = True
        return getattr(self, f"_{fn}")(deployment, state, **payload)

    # -- swapping ------------------------------------------------------------------------------
    def _export_state(self, deployment, state) -> StateTensors:
        """The deployment's state on this rank, by StateManager model id and canonical key; the
        tensors may be the live ones (they are copied out before anything changes them)."""
        raise NotImplementedError(f"{type(self).__name__} cannot swap job state")

    def _import_state(self, deployment, state, tensors: StateTensors) -> None:
        """Install tensors read back from the StateManager (new tensors on ``self.device``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot swap job state")

    def _release(self, deployment, state) -> None:
        """Free the deployment's device tensors (its structure and counters stay): by default the
        parameters and gradients of ``state.model`` and the optimizer's state."""
        free_parameters(state.model)
        if state.optimizer is not None:
            state.optimizer.state.clear()

    def _register_base(self, deployment, state, model_dir) -> None:
        """The new state is the base model's: in the StateManager it points at the base's blobs
        (held once however many jobs start from it), so it is clean until a call changes it.

        A base key ``(name, WHOLE)`` covers this rank's ``(name, shard)`` when the shard of the
        base tensor has the rank's shape and dtype (a tensor-parallel rank reads its slice of it).
        Every rank checks its own keys; rank 0 alone forks the deployment's model ids (callers with
        several ranks wait for it before any rank reads them)."""
        from engine.state.store import TensorMeta, shard_shape

        client = self.state_client
        base, stored = register_base(client, model_dir)
        tensors = self._export_state(deployment, state)
        for ts in tensors.values():
            for (name, shard), t in ts.items():
                meta, mine = stored.get((name, WHOLE)), TensorMeta.of(t)
                if meta is None or meta.dtype != mine.dtype:
                    return  # e.g. converted on load: the first swap-out writes the state instead
                if shard != WHOLE and (shard.dim >= len(meta.shape) or meta.shape[shard.dim] % shard.count):
                    return
                if shard_shape(meta.shape, shard) != mine.shape:
                    return
        for model, ts in tensors.items():
            if self.rank == 0:
                fork_base(client, base, model)
            state.res.keys[model] = list(ts)
        state.res.dirty = False

    def is_resident(self, deployment):
        return self.states[deployment].res.resident

    def state_models(self, deployment):
        return list(self.states[deployment].res.keys)

    def _client(self):
        if self.state_client is None:
            raise RuntimeError("this worker group does not swap job state (started without a StateManager)")
        return self.state_client

    def swap_out(self, deployment, *, release=True, background=False):
        state = self.states[deployment]
        res = state.res
        out = {"bytes": 0, "seconds": 0.0}
        self._settle(deployment)
        if not res.resident:
            return out
        client = self._client()
        started = time.perf_counter()
        models = list(res.keys)  # before a background write may add to it
        if res.dirty:
            exported = self._export_state(deployment, state)  # the live tensors, kept alive here
            models = list(dict.fromkeys([*models, *exported]))
            res.dirty = False
            if background and release:
                # write-behind: the next job runs while this one's tensors go to the host tier;
                # anything that needs this state again waits for it (``_settle``)
                res.pending = (client.submit(self._write_state, res, exported, True), exported)
            else:
                out["bytes"] = self._write_state(res, exported)
        if release:
            self._release(deployment, state)
            res.resident = False
            for model in models:
                client.call("set_resident", client.wpg, model, None)
        out["seconds"] = time.perf_counter() - started
        return out

    def _write_state(self, res, exported: StateTensors, behind: bool = False) -> int:
        client, nbytes = self._client(), 0
        for model, tensors in exported.items():
            previous = res.keys.get(model, [])
            # a whole tensor is replicated on every rank of a tensor-parallel group: each writes
            # its (identical) copy, rank 0 alone deletes it, so no rank deletes a key twice
            gone = [k for k in previous if k not in tensors and (self.rank == 0 or k[1] != WHOLE)]
            nbytes += client.write(model, tensors, remove=gone)["bytes"]
            res.keys[model] = list(tensors)
        res.version += 1
        if behind:
            self.written_behind += nbytes
        return nbytes

    def _settle(self, deployment) -> None:
        """Wait for a background swap-out of ``deployment`` to finish. If it failed, the state is
        put back on the device (nothing is lost) and the error is raised."""
        state = self.states[deployment]
        if state.res.pending is None:
            return
        (future, exported), state.res.pending = state.res.pending, None
        try:
            future.result()
        except BaseException:
            self._import_state(deployment, state, exported)
            state.res.resident, state.res.dirty = True, True
            raise

    def prefetch(self, deployment):
        state = self.states[deployment]
        pending = state.res.pending
        if pending is not None and not pending[0].done():  # still being written: read it once it is
            pending[0].add_done_callback(lambda _: self.prefetch(deployment))
            return
        if pending is not None and pending[0].exception() is not None:
            return  # the write failed: the state goes back on the device when it is next needed
        if not state.res.resident:
            for model, keys in state.res.keys.items():
                self._client().prefetch(model, keys, device=self.device, version=state.res.version)

    def swap_in(self, deployment):
        self._settle(deployment)
        state = self.states[deployment]
        res = state.res
        if res.resident:
            return {"bytes": 0, "seconds": 0.0}
        client = self._client()
        started = time.perf_counter()
        tensors: StateTensors = {}
        prefetched = 0
        for model, keys in res.keys.items():
            got = client.take(model, res.version)
            prefetched += got is not None
            tensors[model] = (got or client.read(model, keys, device=self.device))[0]
        self._import_state(deployment, state, tensors)
        res.resident, res.dirty = True, False
        nbytes = 0
        for model, ts in tensors.items():
            size = sum(t.numel() * t.element_size() for t in ts.values())
            client.call("set_resident", client.wpg, model, size)
            nbytes += size
        return {"bytes": nbytes, "seconds": time.perf_counter() - started, "prefetched": prefetched}

    def _forget(self, deployment) -> None:
        """Drop a deployment everywhere: this rank and (rank 0) the StateManager."""
        if deployment in self.states:
            with contextlib.suppress(Exception):  # being dropped: a failed write-behind loses nothing wanted
                self._settle(deployment)
        state = self.states.pop(deployment, None)
        if state is not None and self.state_client is not None and self.rank == 0:
            for model in state.res.keys:
                self.state_client.discard(model)
                if self.state_client.call("has_model", model):
                    self.state_client.call("drop", model)

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
        return ForwardResult(logprobs=logp.float().cpu().numpy(), mask=mask.cpu().numpy())

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
