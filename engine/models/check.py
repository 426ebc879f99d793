"""What a Hugging Face model folder must be before the engine takes it from a tenant, and what it is.

``check_model_folder`` reads the folder without running anything in it: only safetensors weights
(never a pickle, which runs code when loaded), no code files, a ``config.json`` naming an
architecture some backend of the engine runs, a tokenizer, and every tensor the architecture
needs with the shape its config gives it (the expected shapes come from ``transformers`` building
the model on the meta device: no memory, no weights). Errors name the file or tensor and what is
wrong (``ModelInvalid``); on success it returns the folder's facts (architecture, parameters,
bytes, dtype), which the platform lists and the job submission checks against the job's backends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import ModelInvalid
from engine.state.megatron_rules import megatron_problem
from engine.workers.backend import DECODERS

# The architectures each backend runs (``config.json``'s ``architectures[0]``), each tested with a
# tiny random model of its own: transformers' log-probs and weights back from Megatron at TP 1 and
# 2 (tests/engine/test_megatron_backend), vLLM sampling as transformers before and after a sync
# from Megatron TP 2 (test_weight_sync), a job through each pair end to end (tests/platform).
BACKEND_ARCHITECTURES: dict[str, frozenset[str]] = {"torch": DECODERS, "vllm": DECODERS, "megatron": DECODERS}
ARCHITECTURES = frozenset().union(*BACKEND_ARCHITECTURES.values())

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz", ".h5", ".msgpack")
CODE_SUFFIXES = (".py", ".pyc", ".so", ".sh")
# what else a model folder holds: configs, tokenizer files (a SentencePiece model is protobuf), a
# chat template, a model card
ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".jinja", ".md")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}  # safetensors' names


def file_problem(name: str) -> str | None:
    """Why a file of this name may not be in a model folder, or None (checked before it is read)."""
    lower = name.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        return (f"{name}: pickle-based weights are not accepted (loading them runs code); "
                "save the model with safetensors (save_pretrained(..., safe_serialization=True))")
    if lower.endswith(CODE_SUFFIXES):
        return f"{name}: code files are not accepted (the engine runs its own model code, never a folder's)"
    if not lower.endswith(ALLOWED_SUFFIXES):
        return f"{name}: not a file a model folder holds (allowed: {', '.join(ALLOWED_SUFFIXES)})"
    return None


def vllm_problem(config: dict[str, Any]) -> str | None:
    """Why vLLM cannot serve the model of ``config`` although it runs its architecture, or None."""
    if config.get("model_type") == "qwen2" and config.get("head_dim"):
        derived = config["hidden_size"] // config["num_attention_heads"]
        if config["head_dim"] != derived:
            return (f"vLLM's Qwen2 takes head_dim as hidden_size / num_attention_heads ({derived}), not "
                    f"config.json's {config['head_dim']}")
    return None


def configuration_problem(config: dict[str, Any], backend: str, tp: int = 1) -> str | None:
    """Why ``backend`` cannot run this model (its ``config.json`` as a mapping), or None: the
    architecture, then what that backend needs of the configuration."""
    architecture = (config.get("architectures") or [""])[0]
    if architecture not in BACKEND_ARCHITECTURES.get(backend, ARCHITECTURES):
        runs = ", ".join(sorted(BACKEND_ARCHITECTURES[backend]))
        return f"the model is a {architecture or 'model of no architecture'}; the {backend} backend runs {runs}"
    if backend == "megatron":
        return megatron_problem(config, tp)
    if backend == "vllm":
        return vllm_problem(config)
    return None


def backends_for(architecture: str) -> list[str]:
    """The backends that run ``architecture``, by name."""
    return sorted(b for b, archs in BACKEND_ARCHITECTURES.items() if architecture in archs)


def check_model_folder(folder: Path) -> dict[str, Any]:
    """Validate ``folder`` as a model a job may train; its facts, or ``ModelInvalid``."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir())
    for path in files:
        if path.is_dir():
            raise ModelInvalid(f"{path.name}/: a model folder holds files only, no subfolders")
        problem = file_problem(path.name)
        if problem:
            raise ModelInvalid(problem)
    config = _config(folder)
    architecture = config["architectures"][0]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelInvalid(f"no tokenizer file ({', '.join(TOKENIZER_FILES)})")
    weights = [p for p in files if p.name.endswith(".safetensors")]
    if not weights:
        raise ModelInvalid("no weights: a model folder needs *.safetensors files")
    stored = _stored_tensors(weights)
    expected, tied = _expected_shapes(folder)
    _compare(stored, expected, tied)
    _check_vocabulary(folder, config)
    dtypes = sorted({dtype for _, dtype in stored.values()})
    return {
        "architecture": architecture,
        "model_type": config.get("model_type", ""),
        "backends": [b for b in backends_for(architecture) if configuration_problem(config, b) is None],
        "parameters": sum(_numel(shape) for shape, _ in stored.values()),
        "size_bytes": sum(p.stat().st_size for p in files),
        "dtype": dtypes[0] if len(dtypes) == 1 else "mixed",
        "tied_embeddings": tied,
    }


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelInvalid("no config.json")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelInvalid(f"config.json: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ModelInvalid("config.json: not a JSON object")
    architectures = config.get("architectures")
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise ModelInvalid("config.json: no architectures list (e.g. [\"Qwen2ForCausalLM\"])")
    if architectures[0] not in ARCHITECTURES:
        raise ModelInvalid(f"config.json: architecture {architectures[0]} is not supported; the engine runs "
                           f"{', '.join(sorted(ARCHITECTURES))}")
    return config


def _stored_tensors(weights: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of the weight files, by name: its shape and dtype (read from the headers only)."""
    from safetensors import safe_open

    stored: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in weights:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                    if key in stored:
                        raise ModelInvalid(f"{path.name}: tensor {key} is also in another weight file")
                    part = f.get_slice(key)
                    dtype = str(part.get_dtype())
                    stored[key] = (tuple(part.get_shape()), DTYPES.get(dtype, dtype.lower()))
        except ModelInvalid:
            raise
        except Exception as exc:  # the library's own error for a bad header, truncated data, ...
            raise ModelInvalid(f"{path.name}: not a readable safetensors file ({str(exc).splitlines()[0]})") from None
    return stored


def _expected_shapes(folder: Path) -> tuple[dict[str, tuple[int, ...]], bool]:
    """The tensors the config's architecture has, with their shapes (the model built on the meta
    device), and whether its output layer is the input embedding (tied, so it need not be stored)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:
        raise ModelInvalid(f"config.json: the model cannot be built from it ({str(exc).splitlines()[0]})") from None
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}, tied


def _compare(stored: dict[str, tuple[tuple[int, ...], str]], expected: dict[str, tuple[int, ...]],
             tied: bool) -> None:
    optional = {"lm_head.weight"} if tied else set()
    missing = sorted(set(expected) - set(stored) - optional)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelInvalid(f"the weights lack tensor {missing[0]}{more}, which config.json's architecture has")
    unexpected = sorted(set(stored) - set(expected))
    if unexpected:
        more = f" and {len(unexpected) - 1} more" if len(unexpected) > 1 else ""
        raise ModelInvalid(f"the weights hold tensor {unexpected[0]}{more}, which config.json's architecture "
                           "does not have")
    for name, shape in sorted(expected.items()):
        if name in stored and stored[name][0] != shape:
            raise ModelInvalid(f"tensor {name} has shape {list(stored[name][0])} in the weights but "
                               f"{list(shape)} by config.json")


def _check_vocabulary(folder: Path, config: dict[str, Any]) -> None:
    from engine.workers.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(folder)
    except Exception as exc:
        raise ModelInvalid(f"the tokenizer does not load ({str(exc).splitlines()[0]})") from None
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise ModelInvalid(f"the tokenizer has {len(tokenizer)} tokens but config.json's vocab_size is {vocab}")
    if tokenizer.eos_token_id is None:
        raise ModelInvalid("the tokenizer has no end-of-sequence token (eos_token)")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
