"""A finished job's final weights as a Hugging Face model folder (safetensors), for download.

The job's driver saves a ``final`` checkpoint through the function API when training ends (the
scheduler serialises it like any call). That checkpoint is in the trainer's own layout; this module
turns it into a folder ``transformers`` loads: the base model's config and tokenizer files, and
``model.safetensors`` with Hugging Face names.

- torch trainer: the checkpoint's ``model.safetensors`` already has Hugging Face names;
- megatron trainer: one ``rank<k>/model.safetensors`` per tensor-parallel rank, in Megatron names
  and slices; each rank's tensors are converted with ``layout.megatron_to_hf`` and the slices of
  each tensor gathered (``layout.gather_shards``) — the same conversion weight sync uses.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# Files of a Hugging Face folder, other than weights, that a loader needs beside them.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


def _megatron_weights(checkpoint: Path, model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoConfig

    from engine.state.layout import gather_shards, megatron_to_hf

    ranks = sorted(checkpoint.glob("rank*/model.safetensors"), key=lambda p: int(p.parent.name[4:]))
    if not ranks:
        raise FileNotFoundError(f"no rank*/model.safetensors in {checkpoint}")
    config = AutoConfig.from_pretrained(model_dir)
    parts: dict[str, list] = defaultdict(list)
    for rank, path in enumerate(ranks):
        for name, tensor, spec in megatron_to_hf(load_file(path), config, rank, len(ranks)):
            parts[name].append((tensor, spec))
    return {name: gather_shards(shards).contiguous() for name, shards in parts.items()}


def export_hf(checkpoint: Path, model_dir: Path, out: Path) -> list[str]:
    """Write the Hugging Face folder ``out`` from ``checkpoint`` (a ``final`` checkpoint) and the base
    ``model_dir``; returns the files written. Written under ``out.tmp`` and renamed: a folder that
    exists is whole."""
    checkpoint, model_dir, out = Path(checkpoint), Path(model_dir), Path(out)
    if (checkpoint / "model.safetensors").is_file():
        weights = load_file(checkpoint / "model.safetensors")
    else:
        weights = _megatron_weights(checkpoint, model_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    for name in SIDE_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return sorted(p.name for p in out.iterdir())
