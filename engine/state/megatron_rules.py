"""What Megatron's conversion (``engine.state.layout``) needs of a Hugging Face model's configuration,
read from ``config.json`` as a plain mapping: no torch, no transformers. The layout checks a
loaded config with it before it converts anything, and the model check (``engine.models.check``)
and the platform's job submission check an uploaded model with it before a job starts."""

from __future__ import annotations

from typing import Any

# The Hugging Face architectures Megatron trains, by ``model_type``: their attention differs only in
# the q, k, v biases (Qwen2) and the per-head RMSNorm of q and k before the rotary embedding (Qwen3).
MEGATRON_MODEL_TYPES = ("qwen2", "llama", "qwen3")


def _rope_type(config: dict[str, Any]) -> str:
    """The rotary embedding's scaling: ``rope_parameters`` (transformers 5) or ``rope_scaling``
    (older configs), whichever names one."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key) or {}
        kind = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
        if kind and kind != "default":
            return kind
    return "default"


def megatron_problem(config: dict[str, Any], tp: int) -> str | None:
    """Why Megatron cannot train the model of ``config`` (``config.json`` as a mapping) at tensor
    parallel size ``tp``, or None."""
    if tp < 1:
        return f"tensor parallel size must be >= 1, got {tp}"
    model_type = config.get("model_type")
    if model_type not in MEGATRON_MODEL_TYPES:
        return f"Megatron conversion supports {', '.join(MEGATRON_MODEL_TYPES)} models, not {model_type!r}"
    if model_type != "qwen2" and config.get("attention_bias"):
        return f"a {model_type} model with attention biases is not supported"
    if config.get("mlp_bias"):
        return "MLP biases are not supported"
    if config.get("hidden_act", "silu") != "silu":
        return f"unsupported activation {config.get('hidden_act')!r}"
    if _rope_type(config) != "default":
        return (f"unsupported rope scaling {_rope_type(config)!r} (Megatron conversion takes the default rotary "
                "embedding)")
    if config.get("use_sliding_window"):
        return "sliding-window attention is not supported"
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        size = config.get(name) or (config.get("num_attention_heads") if name == "num_key_value_heads" else None)
        if isinstance(size, int) and size % tp:
            return f"{name}={size} is not divisible by tensor parallel size {tp}"
    return None
