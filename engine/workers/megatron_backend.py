"""Megatron-core training backend: a GPTModel (local layer spec) per deployment, tensor parallel
over the worker group's ranks, trained with a plain torch AdamW.

One worker group is one tensor-parallel layout: Megatron's ``parallel_state`` is per process, so
every rank (a Ray actor) joins the group's ``torch.distributed`` world (gloo on CPU, NCCL on GPU)
once, and every deployment resident in the group is split the same way. Every rank receives every
call (SPMD) in the same order. Log-probs, losses and the optimizer step mean exactly what they mean
in the torch backend: per-token log-probs come from ``sampling.shared_prompt_logprobs`` (each
distinct prompt computed once, called on a view of the GPTModel), losses from ``engine.workers.losses``,
the learning rate from ``OptimizerConfig``.

This backend trains; it neither generates nor syncs. A rollout worker group pulls the trainer's
weights through ``export_weights`` as Hugging Face-named shards (see ``layout``).

Swapping (a group started with ``swapping=``): each rank writes its own part of a deployment's state
to the StateManager under canonical keys, the Hugging Face names and shards ``layout`` converts its
Megatron tensors to: weights, AdamW moments (``"<name>::exp_avg"``, ``"::exp_avg_sq"``; the per-
parameter step count ``"::step"`` whole, under each name the parameter is made of) and pending
gradients (``"<name>::grad"``). Swapping in, a rank reads only its own shards and fuses them back.
A new deployment starts as the registered base model's blobs (nothing is written until it changes).

Megatron is imported lazily, so importing this module (e.g. for ``serves``) stays cheap.
"""

from __future__ import annotations

import datetime
import shutil
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.api import Batch, OptimizerConfig
from engine.state.layout import (
    WHOLE,
    WeightShard,
    hf_to_megatron,
    megatron_config_from_hf,
    megatron_hf_names,
    megatron_layer_spec,
    megatron_param_parts,
    megatron_partition_dim,
    megatron_to_hf,
)
from engine.workers.backend import Deployment, Residency, state_id
from engine.workers.checkpoint import STEPS_KEY, checkpoint_dir, optimizer_tensors, read_safetensors
from engine.workers.devices import worker_device
from engine.workers.sampling import shared_prompt_logprobs
from engine.workers.training import TrainingBackend

RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=5)


@dataclass
class _State:
    model: torch.nn.Module  # this rank's GPTModel
    hf_config: Any
    pad_id: int
    optimizer: torch.optim.Optimizer | None
    optimizer_config: OptimizerConfig | None
    pending_tokens: int = 0  # tokens whose gradients are accumulated and not yet applied
    steps: int = 0  # optimizer steps taken
    res: Residency = field(default_factory=Residency)


class _CausalLMView:
    """A GPTModel called the way ``shared_prompt_logprobs`` calls a transformers causal LM: packed
    rows, a 4-D block mask (True: may attend) and explicit positions. GPTModel takes the mask as
    given but computes rotary embeddings for positions 0..S-1 whatever ``position_ids`` says, so
    for the call the rotary module returns them at the given positions instead (``_rotary_at``).
    Logits are full-vocabulary on every rank (``parallel_output=False``).
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def parameters(self):
        return self.model.parameters()

    def __call__(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
        if attention_mask.dim() != 4:
            raise ValueError("the Megatron backend expects a 4-D block attention mask with position_ids")
        device = next(self.model.parameters()).device
        positions = position_ids.to(device)
        masked_out = ~attention_mask.bool().to(device)  # Megatron's convention: True is masked
        with _rotary_at(self.model.rotary_pos_emb, positions):
            logits = self.model(input_ids.to(device), positions, masked_out)  # [B, S, V]
        return SimpleNamespace(logits=logits.to(input_ids.device))


@contextmanager
def _rotary_at(rotary: torch.nn.Module, positions: torch.Tensor):
    """While active, ``rotary`` (a Megatron ``RotaryEmbedding``) returns the embeddings of
    ``positions`` ``[B, S]``, shaped ``[S, B, 1, dim]`` (broadcast over heads as its own
    ``[S, 1, 1, dim]`` is), instead of those of positions 0..S-1: the same angles, per row."""
    if rotary.rotary_interleaved:
        raise NotImplementedError("explicit positions with interleaved rotary embeddings")
    factor = rotary.seq_len_interpolation_factor

    def at_positions(*_args, **_kwargs):
        inv_freq = rotary.inv_freq.to(positions.device)  # kept on the CPU when built there
        seq = positions.to(inv_freq.dtype)
        if factor is not None:
            seq = seq * (1 / factor)
        freqs = seq[..., None] * inv_freq  # [B, S, dim / 2]
        return torch.cat((freqs, freqs), dim=-1).transpose(0, 1)[:, :, None, :]

    rotary.forward = at_positions  # an instance attribute: Module.__call__ runs it
    try:
        yield
    finally:
        del rotary.forward


def _init_parallel(rank: int, world_size: int, dist_url: str | None) -> torch.device:
    """Join the group's torch.distributed world and split it into one tensor-parallel group."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    from engine.workers import megatron_cpu

    megatron_cpu.apply()
    device = worker_device(rank)
    cuda = device.type == "cuda"
    if not dist.is_initialized():
        if dist_url is None:
            if world_size != 1:
                raise ValueError("a Megatron group of several ranks needs a dist_url to meet at")
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(
                "nccl" if cuda else "gloo", init_method=dist_url, rank=rank, world_size=world_size,
                timeout=RENDEZVOUS_TIMEOUT,
            )
    if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise RuntimeError(f"this process is rank {dist.get_rank()} of {dist.get_world_size()}, "
                           f"not {rank} of {world_size}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    # Dropout is off and weights are loaded, so no RNG stream is ever forked; the inference tracker
    # is a no-op that, unlike the default one, never touches the CUDA RNG.
    initialize_rng_tracker(inference_rng_tracker=True)
    return device


def _assign(model: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Copy ``tensors`` into the model's parameters; names and shapes must match exactly (checked
    for all of them before anything is copied)."""
    params = dict(model.named_parameters())
    missing, unexpected = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
    wrong = sorted(n for n in set(params) & set(tensors) if params[n].shape != tensors[n].shape)
    if missing or unexpected or wrong:
        raise ValueError(f"{what} does not fit the model: missing {missing}, unexpected {unexpected}, "
                         f"wrong shapes {[(n, tuple(tensors[n].shape), tuple(params[n].shape)) for n in wrong]}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name])


def _mark_tensor_parallel(model: torch.nn.Module) -> None:
    """Give every split parameter Megatron's tensor-parallel attributes (what
    ``set_tensor_model_parallel_attributes`` sets). Megatron sets them on weights only while
    initialising them, which we skip (``perform_initialization=False``), and the global grad norm
    (``param_is_not_tensor_parallel_duplicate``) depends on them."""
    for name, p in model.named_parameters():
        dim = megatron_partition_dim(name)
        if dim is not None:
            p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


class MegatronBackend(TrainingBackend):
    serves = frozenset({"forward", "forward_backward", "optim_step", "save_checkpoint", "load_checkpoint"})

    def __init__(self, *, rank: int, world_size: int, data_dir: Path, dist_url: str | None = None):
        super().__init__(rank=rank, world_size=world_size, data_dir=data_dir, dist_url=dist_url)
        self.device = _init_parallel(rank, world_size, dist_url)
        self.states: dict[Deployment, _State] = {}

    def warm(self):
        from megatron.core.models.gpt import GPTModel  # noqa: F401  (seconds, the first time in a process)
        from transformers import AutoConfig  # noqa: F401

    # -- residency ---------------------------------------------------------------------------
    def create(self, deployment, model_dir, *, trainable, optimizer, side=""):
        """Facts: ``params`` of the whole (logical) model, ``bytes`` of this rank's parameters."""
        if side:
            raise ValueError(f"a Megatron group trains; it cannot be the {side} side of {deployment}")
        from megatron.core.models.gpt import GPTModel
        from transformers import AutoConfig

        from engine.workers.tokenizer import load_tokenizer

        hf_config = AutoConfig.from_pretrained(model_dir)
        tokenizer = load_tokenizer(model_dir)
        hf_tensors = read_safetensors(model_dir)
        if hf_config.tie_word_embeddings:
            hf_tensors.pop("lm_head.weight", None)
        config, kwargs = megatron_config_from_hf(hf_config, self.world_size)
        model = GPTModel(
            config=config, transformer_layer_spec=megatron_layer_spec(hf_config), **kwargs
        )
        _mark_tensor_parallel(model)
        _assign(model, hf_to_megatron(hf_tensors, hf_config, self.rank, self.world_size), f"model {model_dir}")
        model.to(self.device)
        model.eval()  # no dropout anywhere; gradients still flow
        if trainable:
            cfg = optimizer or OptimizerConfig()
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        else:
            for p in model.parameters():
                p.requires_grad_(False)
            cfg, opt = None, None
        state = self.states[deployment] = _State(model, hf_config, tokenizer.pad_token_id, opt, cfg)
        if self.state_client is not None:
            self._register_base(deployment, state, model_dir)
            _barrier()  # rank 0 forked the deployment's state: from now on every rank may read it
        return {
            "params": sum(t.numel() for t in hf_tensors.values()),
            "bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "tensor_parallel": self.world_size,
        }

    # -- swapping ------------------------------------------------------------------------------
    def _export_state(self, deployment, state):
        cfg, rank, tp = state.hf_config, self.rank, self.world_size
        out: dict = {}

        def convert(local: dict[str, torch.Tensor], suffix: str) -> None:
            for name, t, spec in megatron_to_hf(local, cfg, rank, tp, partial=True, copy=False):
                out[(name + suffix, spec)] = t

        params = dict(state.model.named_parameters())
        convert({n: p.detach() for n, p in params.items()}, "")
        convert({n: p.grad for n, p in params.items() if p.grad is not None}, "::grad")
        if state.optimizer is not None:
            fields: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
            for n, p in params.items():
                for field, value in state.optimizer.state.get(p, {}).items():
                    fields[field][n] = torch.as_tensor(value)
            parts = megatron_param_parts(cfg, rank, tp)
            for field, local in fields.items():
                convert({n: t for n, t in local.items() if t.dim()}, f"::{field}")
                for n, t in local.items():
                    if not t.dim():  # a per-parameter scalar (the step count): whole, under each name
                        for name, _ in parts[n]:
                            out[(f"{name}::{field}", WHOLE)] = t
        return {state_id(deployment): out}

    def _import_state(self, deployment, state, tensors):
        cfg, rank, tp = state.hf_config, self.rank, self.world_size
        by_field: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        for (key, _), t in tensors[state_id(deployment)].items():
            name, _, field = key.partition("::")
            by_field[field][name] = t
        # this rank's own slices, fused back into its Megatron tensors (no full tensor is built)
        weights = hf_to_megatron(by_field.pop(""), cfg, rank, tp, sliced=True, copy=False)
        grads = hf_to_megatron(by_field.pop("grad", {}), cfg, rank, tp, sliced=True, partial=True, copy=False)
        moments: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        parts = megatron_param_parts(cfg, rank, tp)
        for field, stored in by_field.items():
            if all(not t.dim() for t in stored.values()):  # per-parameter scalars (AdamW keeps them on the CPU)
                for n, keys in parts.items():
                    if keys[0][0] in stored:
                        moments[n][field] = stored[keys[0][0]].cpu()
                continue
            for n, t in hf_to_megatron(stored, cfg, rank, tp, sliced=True, partial=True, copy=False).items():
                moments[n][field] = t
        for name, p in state.model.named_parameters():
            p.data = weights[name]
            p.grad = grads.get(name)
            if state.optimizer is not None and moments.get(name):
                state.optimizer.state[p] = moments[name]

    # -- API functions -----------------------------------------------------------------------
    def _logprobs(self, state: _State, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return shared_prompt_logprobs(_CausalLMView(state.model), batch.prompts, batch.completions, state.pad_id)

    def _grad_norm(self, params):
        return _global_grad_norm(params, self.device)

    def export_weights(self, deployment, names=None) -> list[WeightShard]:
        state = self.states[deployment]
        return self._hf_shards(state, dict(state.model.named_parameters()), names)

    def debug_grad_shards(self, deployment, names=None) -> list[WeightShard]:
        """Test/debug only: this rank's accumulated gradients laid out like ``export_weights``
        (zeros where a parameter has no gradient). Not an API function."""
        state = self.states[deployment]
        grads = {
            n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in state.model.named_parameters()
        }
        return self._hf_shards(state, grads, names)

    def _hf_shards(self, state: _State, local: dict[str, torch.Tensor], names) -> list[WeightShard]:
        converted = megatron_to_hf(local, state.hf_config, self.rank, self.world_size, names)
        return [(name, t.cpu(), spec) for name, t, spec in converted]

    def weight_names(self, deployment):
        return megatron_hf_names(self.states[deployment].hf_config, self.world_size)

    # -- checkpoints -------------------------------------------------------------------------
    # A checkpoint holds every rank's own state under <tag>/rank<k>/: the Megatron-named weights of
    # its shard, and (trainable deployments) its AdamW moments and the optimizer step count. All
    # ranks write under <tag>.tmp/, which rank 0 renames to <tag> once every rank is done.

    def _save_checkpoint(self, deployment, state, *, tag: str):
        path = checkpoint_dir(self.data_dir, deployment, tag)
        tmp = path.with_name(path.name + ".tmp")
        if self.rank == 0 and tmp.exists():
            shutil.rmtree(tmp)  # left over from a save that did not finish
        _barrier()
        mine = tmp / f"rank{self.rank}"
        mine.mkdir(parents=True)
        weights = {n: p.detach().cpu().contiguous() for n, p in state.model.named_parameters()}
        save_file(weights, mine / "model.safetensors")
        if state.optimizer is not None:
            tensors = optimizer_tensors(state.model, state.optimizer)
            tensors[STEPS_KEY] = torch.tensor(state.steps)
            save_file({k: v.cpu() for k, v in tensors.items()}, mine / "optimizer.safetensors")
        _barrier()
        if self.rank == 0:
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        _barrier()  # no rank returns before the checkpoint is in place
        return {"path": str(path)}

    def _load_checkpoint(self, deployment, state, *, tag: str):
        path = checkpoint_dir(self.data_dir, deployment, tag)
        if not path.is_dir():
            raise FileNotFoundError(f"no checkpoint {tag!r} for {deployment}")
        # checked in the same order on every rank, so all ranks fail alike
        ranks = sorted(p.name for p in path.iterdir() if p.name.startswith("rank"))
        if ranks != sorted(f"rank{k}" for k in range(self.world_size)):
            raise ValueError(f"checkpoint {tag!r} was saved by {len(ranks)} ranks, this group has {self.world_size}")
        mine = path / f"rank{self.rank}"
        if not (mine / "model.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {tag!r} for {deployment} has no weights for rank {self.rank}")
        _assign(state.model, load_file(mine / "model.safetensors", device=str(self.device)), f"checkpoint {tag!r}")
        self._restore_optimizer(state, mine)
        return {"path": str(path)}


def _global_grad_norm(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of the whole model's gradient: each tensor-parallel shard once, and each tensor
    replicated on every rank (norms) once, summed over the tensor-parallel group."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    squares = torch.zeros((), dtype=torch.float32, device=device)
    for p in params:
        if param_is_not_tensor_parallel_duplicate(p):
            squares = squares + torch.linalg.vector_norm(p.grad.float()) ** 2
    group = parallel_state.get_tensor_model_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(squares, group=group)
    return squares.sqrt()
