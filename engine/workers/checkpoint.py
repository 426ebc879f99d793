"""Checkpoint pieces shared by the training backends: where a checkpoint lives and how a torch
optimizer's state becomes flat, named tensors (for safetensors) and back."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

STEPS_KEY = "__optimizer_steps__"  # optimizer steps taken: the lr schedule resumes where it was


def checkpoint_dir(data_dir: Path, deployment: tuple[str, str], tag: str) -> Path:
    job, role = deployment
    return Path(data_dir) / "checkpoints" / job / role / tag


def optimizer_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as ``{"<param name>::<field>": tensor}``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, value in opt.state.get(p, {}).items():
                t = value if torch.is_tensor(value) else torch.tensor(value)
                out[f"{names[id(p)]}::{key}"] = t.detach().to("cpu", copy=True).contiguous()
    return out


def load_optimizer_tensors(
    model: torch.nn.Module, opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor]
) -> None:
    """Inverse of ``optimizer_tensors``; a moment whose shape is not its parameter's is an error."""
    params = dict(model.named_parameters())
    for key, value in tensors.items():
        name, field = key.split("::")
        if name not in params:
            raise ValueError(f"optimizer state for unknown parameter {name!r}")
        if value.dim() and value.shape != params[name].shape:
            raise ValueError(f"optimizer state {key} has shape {tuple(value.shape)}, "
                             f"the parameter {tuple(params[name].shape)}")
        opt.state[params[name]][field] = value.clone()


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model folder (all ``*.safetensors`` shards), on the CPU."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    return tensors
