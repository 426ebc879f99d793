"""Plain PyTorch / transformers backend: serves every API function on one rank.

Each deployment keeps two copies of its weights: the trainer's (updated by ``optim_step``) and the
rollout copy that ``generate`` uses; ``sync_weights`` makes the trainer's the rollout's, so a job
samples from exactly the weights it last synced, as it would with a separate rollout engine.
Log-probs for ``forward`` and ``forward_backward`` are computed once per distinct prompt of a batch
(``sampling.shared_prompt_logprobs``): GRPO's rows come in groups that share their prompt.
"""

from __future__ import annotations

import copy
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine.api import (
    FUNCTIONS,
    OptimizerConfig,
    SamplingParams,
)
from engine.state.layout import WHOLE
from engine.workers.backend import DECODERS, Deployment, Residency, state_id
from engine.workers.checkpoint import STEPS_KEY, checkpoint_dir, optimizer_tensors
from engine.workers.devices import worker_device
from engine.workers.sampling import generate, shared_prompt_logprobs
from engine.workers.training import TrainingBackend, free_parameters


@dataclass
class _State:
    model: torch.nn.Module  # trainer weights
    rollout: torch.nn.Module  # weights generate() samples from
    tokenizer: Any
    optimizer: torch.optim.Optimizer | None
    optimizer_config: OptimizerConfig | None
    pending_tokens: int = 0  # tokens whose gradients are accumulated and not yet applied
    steps: int = 0  # optimizer steps taken
    res: Residency = field(default_factory=Residency)
    weights_id: str = ""  # StateManager model id of ``model``'s state (see ``create``)


def _state_bytes(module: torch.nn.Module) -> int:
    # parameters() yields tied weights once, state_dict() twice
    return sum(p.numel() * p.element_size() for p in module.parameters())


class TorchBackend(TrainingBackend):
    serves = frozenset(FUNCTIONS)

    def __init__(self, *, rank: int, world_size: int, data_dir: Path):
        if world_size != 1:
            raise ValueError("the torch backend runs on one rank")
        super().__init__(rank=rank, world_size=world_size, data_dir=data_dir)
        self.states: dict[Deployment, _State] = {}
        self.device = worker_device(rank)

    def warm(self):
        """Besides transformers' import (seconds, the first time in a process), a model of each
        architecture built once, a tiny one: the first model a process builds costs a few tenths
        of a second more than the next (each architecture's module, its first initialisers)."""
        import transformers
        from transformers import AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):  # their random weights leave the rank's generator as it was
            for architecture in sorted(DECODERS):
                config = getattr(transformers, architecture).config_class(
                    vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=16)
                AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    # -- residency ---------------------------------------------------------------------------
    def create(self, deployment, model_dir, *, trainable, optimizer, side=""):
        """``side`` "rollout": the sampling side of a deployment trained on another group; its
        weights are a state of their own (``job/role@rollout``), never the trainer's ``job/role``
        (two groups holding one deployment must not write each other's state)."""
        from transformers import AutoModelForCausalLM

        from engine.workers.tokenizer import load_tokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        model.eval()
        tokenizer = load_tokenizer(model_dir)
        if trainable:
            cfg = optimizer or OptimizerConfig()
            opt = torch.optim.AdamW(
                model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
            )
            rollout = copy.deepcopy(model)
        else:
            for p in model.parameters():
                p.requires_grad_(False)
            cfg, opt, rollout = None, None, model
        state = self.states[deployment] = _State(model, rollout, tokenizer, opt, cfg,
                                                 weights_id=state_id(deployment, side))
        if self.state_client is not None:
            self._register_base(deployment, state, model_dir)
        return {"params": sum(p.numel() for p in model.parameters()), "bytes": _state_bytes(model)}

    # -- swapping ------------------------------------------------------------------------------
    def _export_state(self, deployment, state):
        trainer: dict = {}
        for name, p in state.model.named_parameters():  # a tied lm_head is the embedding
            trainer[(name, WHOLE)] = p.detach()
            if p.grad is not None:
                trainer[(f"{name}::grad", WHOLE)] = p.grad
            if state.optimizer is not None:
                for key, value in state.optimizer.state.get(p, {}).items():
                    trainer[(f"{name}::{key}", WHOLE)] = value
        out = {state.weights_id: trainer}
        if state.rollout is not state.model:
            out[state_id(deployment, "sampler")] = {(n, WHOLE): p.detach() for n, p in state.rollout.named_parameters()}
        return out

    def _import_state(self, deployment, state, tensors):
        trainer = tensors[state.weights_id]
        fields: dict[str, dict[str, torch.Tensor]] = {}  # parameter -> its optimizer state, by field
        for (key, _), t in trainer.items():
            name, _, field = key.partition("::")
            if field and field != "grad":
                fields.setdefault(name, {})[field] = t
        for name, p in state.model.named_parameters():
            p.data = trainer[(name, WHOLE)]
            p.grad = trainer.get((f"{name}::grad", WHOLE))
            if state.optimizer is not None:
                moments = fields.get(name, {})
                if "step" in moments:  # AdamW keeps its step counts on the CPU
                    moments["step"] = moments["step"].cpu()
                if moments:
                    state.optimizer.state[p] = moments
        if state.rollout is not state.model:
            rollout = tensors[state_id(deployment, "sampler")]
            for name, p in state.rollout.named_parameters():
                p.data = rollout[(name, WHOLE)]

    def _release(self, deployment, state):
        super()._release(deployment, state)
        if state.rollout is not state.model:
            free_parameters(state.rollout)

    # -- API functions -----------------------------------------------------------------------
    def _generate(self, deployment, state, *, prompts: list[list[int]], sampling: SamplingParams):
        return generate(state.rollout, state.tokenizer, prompts, sampling)

    def _logprobs(self, state, batch):
        return shared_prompt_logprobs(state.model, batch.prompts, batch.completions, state.tokenizer.pad_token_id)

    def _sync_weights(self, deployment, state, *, source: list[Any] | None = None):
        """Trainer weights become the rollout's: this rank's own trainer copy, or, when the trainer
        is another group (``source``: its ranks), pulled from it one logical tensor at a time."""
        started = time.perf_counter()
        if source is not None:
            from engine.workers.weights import pull_weights

            _, tensors = pull_weights(source, deployment)
            params = dict(state.rollout.named_parameters())
            nbytes = 0
            with torch.no_grad():
                for name, tensor in tensors:
                    if name not in params or params[name].shape != tensor.shape:
                        raise ValueError(f"trainer weight {name} {tuple(tensor.shape)} does not fit {deployment}")
                    params[name].copy_(tensor)
                    nbytes += tensor.numel() * tensor.element_size()
            return {"bytes": nbytes, "seconds": time.perf_counter() - started}
        if state.rollout is not state.model:
            with torch.no_grad():
                for dst, src in zip(state.rollout.parameters(), state.model.parameters(), strict=True):
                    dst.copy_(src)
        return {"bytes": _state_bytes(state.model), "seconds": time.perf_counter() - started}

    def weight_names(self, deployment):
        return list(_hf_weights(self.states[deployment].model))  # views, no copies

    def export_weights(self, deployment, names=None):
        state = self.states[deployment]
        weights = _hf_weights(state.model)
        keys = list(weights) if names is None else names
        return [(k, weights[k].detach().to("cpu", copy=True), WHOLE) for k in keys]

    # -- checkpoints -------------------------------------------------------------------------
    def _save_checkpoint(self, deployment, state, *, tag: str):
        path = checkpoint_dir(self.data_dir, deployment, tag)
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file({k: v.cpu() for k, v in _hf_weights(state.model).items()}, tmp / "model.safetensors")
        if state.optimizer is not None:
            tensors = optimizer_tensors(state.model, state.optimizer)
            tensors[STEPS_KEY] = torch.tensor(state.steps)  # the warm-up schedule resumes where it was
            save_file(tensors, tmp / "optimizer.safetensors")
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        return {"path": str(path)}

    def _load_checkpoint(self, deployment, state, *, tag: str):
        path = checkpoint_dir(self.data_dir, deployment, tag)
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"no checkpoint {tag!r} for {deployment}")
        weights = load_file(path / "model.safetensors", device=str(self.device))
        missing, unexpected = state.model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if state.model.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            raise ValueError(f"checkpoint {tag!r} does not fit {deployment}: missing {sorted(set(missing) - tied)}, "
                             f"unexpected {sorted(unexpected)}")
        self._restore_optimizer(state, path)
        self._sync_weights(deployment, state)  # a restored job samples from what it saved
        return {"path": str(path)}


def _hf_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights by Hugging Face name, each tensor once (a tied ``lm_head`` is the embedding)."""
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    return weights

