"""Logical tensors and their shards: the one place that knows how a model's weights are laid out.

A trainer rank exports its weights as ``(name, tensor, ShardSpec)`` triples, where ``name`` is the
Hugging Face (canonical) tensor name and the spec says which slice of that logical tensor the rank
holds. A consumer with another layout gathers the slices of one logical tensor at a time, so a
whole model never has to exist twice in memory. Backend-specific conversions (Megatron fused QKV,
gated MLP, vocab-parallel embeddings, Qwen3's q and k norms <-> Hugging Face Qwen2, Llama and Qwen3)
live in this module too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.state.megatron_rules import megatron_problem


@dataclass(frozen=True)
class ShardSpec:
    """Slice ``index`` of ``count`` equal parts of a logical tensor along ``dim``; ``dim=None``: whole."""

    dim: int | None = None
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"bad shard {self.index} of {self.count}")
        if self.dim is None and self.count != 1:
            raise ValueError("a whole tensor has one shard")
        # computed once: specs key the StateManager's tables, which hash them per tensor per swap
        object.__setattr__(self, "_hash", hash((self.dim, self.index, self.count)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # the hash is not sent: None's differs between processes
        return ShardSpec, (self.dim, self.index, self.count)


WHOLE = ShardSpec()

WeightShard = tuple[str, torch.Tensor, ShardSpec]


def gather_shards(shards: Sequence[tuple[torch.Tensor, ShardSpec]]) -> torch.Tensor:
    """The logical tensor from its shards (any order; replicas of a whole tensor collapse to one)."""
    if not shards:
        raise ValueError("no shards to gather")
    specs = {spec for _, spec in shards}
    if specs == {WHOLE}:
        return shards[0][0]
    dims = {spec.dim for spec in specs}
    counts = {spec.count for spec in specs}
    if len(dims) != 1 or len(counts) != 1 or None in dims:
        raise ValueError(f"inconsistent shard specs {sorted(map(str, specs))}")
    count = counts.pop()
    by_index = {spec.index: t for t, spec in shards}
    if sorted(by_index) != list(range(count)):
        raise ValueError(f"shards {sorted(by_index)} do not cover 0..{count - 1}")
    return torch.cat([by_index[i] for i in range(count)], dim=dims.pop())


# --- Hugging Face Qwen2 / Llama / Qwen3 <-> Megatron-core GPTModel (local layer spec) -------------
#
# Megatron keeps one tensor-parallel rank's slice of each fused tensor:
# - ``linear_qkv`` ([q, k, v] rows of every query group in turn: the ``heads/groups`` query heads of
#   group g, then k_g, then v_g) is split by whole groups, so rank r holds groups
#   ``r*G/tp .. (r+1)*G/tp - 1``, i.e. slice r of q_proj, k_proj and v_proj (weights and biases);
# - ``linear_fc1`` of a gated MLP is ``[gate_r; up_r]`` per rank: slice r of gate_proj then of up_proj;
# - ``linear_proj`` / ``linear_fc2`` (row parallel) hold slice r of o_proj / down_proj along dim 1;
# - the vocab-parallel embedding (and an untied output layer) hold slice r of the vocabulary (dim 0);
# - norms are whole on every rank.


def _new(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy that shares no memory with ``t`` (exports must not alias parameters)."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def _qkv_bias(hf_config) -> bool:
    return hf_config.model_type == "qwen2"


def _qk_norm(hf_config) -> bool:
    return hf_config.model_type == "qwen3"


def megatron_layer_spec(hf_config):
    """The Megatron-core layer spec of the model (local: no Transformer Engine)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=_qk_norm(hf_config))


def check_megatron_layout(hf_config, tp: int) -> None:
    """``ValueError`` unless Megatron trains this model at tensor parallel size ``tp``
    (``engine.state.megatron_rules``, which reads the config as a plain mapping)."""
    problem = megatron_problem(hf_config.to_dict(), tp)
    if problem:
        raise ValueError(problem)


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _rope_theta(hf_config) -> float:
    rope = getattr(hf_config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def megatron_config_from_hf(hf_config, tp: int) -> tuple[object, dict]:
    """``(TransformerConfig, GPTModel keyword arguments)`` for a Hugging Face Qwen2, Llama or Qwen3
    config at tensor parallel size ``tp``; build with ``GPTModel(config=..., transformer_layer_spec=
    megatron_layer_spec(hf_config), **kwargs)``.

    fp32, CPU initialisation, no dropout, no fused kernels; parameters are left uninitialised
    (``perform_initialization=False``) because they are loaded from the Hugging Face weights.
    """
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_megatron_layout(hf_config, tp)
    config = TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=_head_dim(hf_config),
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=_qkv_bias(hf_config),
        qk_layernorm=_qk_norm(hf_config),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        perform_initialization=False,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )
    kwargs = {
        "vocab_size": hf_config.vocab_size,
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": _rope_theta(hf_config),
        "share_embeddings_and_output_weights": bool(hf_config.tie_word_embeddings),
        "parallel_output": False,  # full logits on every rank: exact log-softmax, one loss code path
    }
    return config, kwargs


def _qkv_groups(hf_config, tp_size: int) -> tuple[int, int, int]:
    """(query groups on one rank, query heads per group, head dim)."""
    groups = hf_config.num_key_value_heads
    return groups // tp_size, hf_config.num_attention_heads // groups, _head_dim(hf_config)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, per_group: int, dim: int):
    rest = q.shape[1:]
    parts = (q.reshape(groups, per_group * dim, *rest), k.reshape(groups, dim, *rest), v.reshape(groups, dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest).contiguous()


def _split_qkv(qkv: torch.Tensor, groups: int, per_group: int, dim: int):
    """The q, k and v rows of a fused tensor (views where the layout allows)."""
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(groups, (per_group + 2) * dim, *rest).split([per_group * dim, dim, dim], dim=1)
    return tuple(x.reshape(-1, *rest) for x in (q, k, v))


_MEGATRON_DIMS = (  # name suffix -> the dimension tensor parallelism splits (None: replicated)
    ("layernorm.weight", None),
    ("linear_proj.weight", 1),
    ("linear_fc2.weight", 1),
    ("linear_qkv.weight", 0),
    ("linear_qkv.bias", 0),
    ("linear_fc1.weight", 0),
    ("word_embeddings.weight", 0),
    ("output_layer.weight", 0),
)


def megatron_partition_dim(name: str) -> int | None:
    """The dimension along which Megatron parameter ``name`` is split over tensor-parallel ranks,
    or None for a tensor every rank holds whole (the norms)."""
    for suffix, dim in _MEGATRON_DIMS:
        if name.endswith(suffix):
            return dim
    raise KeyError(f"no tensor-parallel layout for Megatron parameter {name!r}")


@dataclass(frozen=True)
class _Param:
    """One Megatron parameter of a tensor-parallel rank and the slices of Hugging Face tensors it
    is made of (the keys under which the rank's part of the model is canonical)."""

    name: str  # Megatron name
    kind: str  # "copy": the one slice as it is; "qkv": q, k, v fused by query group; "fc1": [gate; up]
    parts: tuple[tuple[str, ShardSpec], ...]  # (HF name, the rank's slice of it), in fusing order


def _megatron_params(hf_config, tp_rank: int, tp_size: int) -> list[_Param]:
    """The conversion between the two layouts, both ways: every Megatron parameter of rank
    ``tp_rank``, in a fixed order (by layer), with its Hugging Face slices."""
    check_megatron_layout(hf_config, tp_size)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"bad tensor parallel rank {tp_rank} of {tp_size}")
    split = ShardSpec(0, tp_rank, tp_size)
    row = ShardSpec(1, tp_rank, tp_size)

    def one(mg: str, hf: str, spec: ShardSpec) -> _Param:
        return _Param(mg, "copy", ((hf, spec),))

    params = [one("embedding.word_embeddings.weight", "model.embed_tokens.weight", split)]
    for i in range(hf_config.num_hidden_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        params.append(one(mg + "input_layernorm.weight", hf + "input_layernorm.weight", WHOLE))
        for kind in ("weight", "bias") if _qkv_bias(hf_config) else ("weight",):
            parts = tuple((f"{hf}self_attn.{x}_proj.{kind}", split) for x in "qkv")
            params.append(_Param(f"{mg}self_attention.linear_qkv.{kind}", "qkv", parts))
        if _qk_norm(hf_config):  # one RMSNorm over each head's channels, the same on every head and rank
            params.append(one(mg + "self_attention.q_layernorm.weight", hf + "self_attn.q_norm.weight", WHOLE))
            params.append(one(mg + "self_attention.k_layernorm.weight", hf + "self_attn.k_norm.weight", WHOLE))
        params.append(one(mg + "self_attention.linear_proj.weight", hf + "self_attn.o_proj.weight", row))
        params.append(one(mg + "pre_mlp_layernorm.weight", hf + "post_attention_layernorm.weight", WHOLE))
        parts = ((hf + "mlp.gate_proj.weight", split), (hf + "mlp.up_proj.weight", split))
        params.append(_Param(mg + "mlp.linear_fc1.weight", "fc1", parts))
        params.append(one(mg + "mlp.linear_fc2.weight", hf + "mlp.down_proj.weight", row))
    params.append(one("decoder.final_layernorm.weight", "model.norm.weight", WHOLE))
    if not hf_config.tie_word_embeddings:
        params.append(one("output_layer.weight", "lm_head.weight", split))
    return params


def megatron_param_parts(hf_config, tp_rank: int, tp_size: int) -> dict[str, list[tuple[str, ShardSpec]]]:
    """``{Megatron name: [(HF name, ShardSpec)]}``: the canonical keys each parameter of rank
    ``tp_rank`` is made of (e.g. for a per-parameter scalar stored under each of them)."""
    return {p.name: list(p.parts) for p in _megatron_params(hf_config, tp_rank, tp_size)}


def hf_to_megatron(
    hf_tensors, hf_config, tp_rank: int, tp_size: int, *, sliced: bool = False, partial: bool = False,
    copy: bool = True,
) -> dict[str, torch.Tensor]:
    """This tensor-parallel rank's Megatron GPTModel parameters (by Megatron name) from Hugging
    Face tensors by name: the full tensors, or (``sliced``) only this rank's slices of them
    (the ShardSpecs ``megatron_to_hf`` gives), so a rank that reads just its own shards never
    builds a full tensor. Every parameter of the model is produced, each a new tensor; with
    ``partial``, only those whose Hugging Face tensors are all given (e.g. the optimizer moments
    of the parameters that have some); with ``copy=False`` a parameter that is one slice as it is
    may be a view of the given tensor (fused ones are always new)."""
    params = _megatron_params(hf_config, tp_rank, tp_size)  # checks the layout first
    groups, per_group, head_dim = _qkv_groups(hf_config, tp_size)

    def take(name: str, spec: ShardSpec) -> torch.Tensor:
        t = hf_tensors[name]
        return t if sliced or spec == WHOLE else t.chunk(spec.count, dim=spec.dim)[spec.index]

    out = {}
    for param in params:
        if partial and any(name not in hf_tensors for name, _ in param.parts):
            continue
        slices = [take(name, spec) for name, spec in param.parts]
        if param.kind == "qkv":
            out[param.name] = _fuse_qkv(*slices, groups, per_group, head_dim)
        elif param.kind == "fc1":
            out[param.name] = torch.cat(slices, dim=0)
        else:
            out[param.name] = _new(slices[0]) if copy else slices[0]
    return out


def _megatron_to_hf_plan(local_state, hf_config, tp_rank: int, tp_size: int):
    """``(HF name, make, ShardSpec, Megatron name)`` for every exported tensor, in a fixed order
    (by layer); ``make()`` builds that one slice (a view where it can), so a caller converts only
    the names it asks for."""
    params = _megatron_params(hf_config, tp_rank, tp_size)  # checks the layout first
    groups, per_group, head_dim = _qkv_groups(hf_config, tp_size)

    def piece(param: _Param, index: int):
        def make() -> torch.Tensor:
            t = local_state[param.name]
            if param.kind == "qkv":
                return _split_qkv(t, groups, per_group, head_dim)[index]
            if param.kind == "fc1":
                return t.chunk(2, dim=0)[index]
            return t

        return make

    return [
        (name, piece(param, index), spec, param.name)
        for param in params
        for index, (name, spec) in enumerate(param.parts)
    ]


def megatron_hf_names(hf_config, tp_size: int = 1) -> list[str]:
    """The HF names ``megatron_to_hf`` exports, in its order (no tensor is touched)."""
    return [name for name, _, _, _ in _megatron_to_hf_plan({}, hf_config, 0, tp_size)]


def megatron_to_hf(
    local_state, hf_config, tp_rank: int, tp_size: int, names=None, *, partial: bool = False, copy: bool = True,
) -> list[WeightShard]:
    """This rank's Megatron tensors as ``(HF name, slice, ShardSpec)``: every exported tensor in a
    fixed order (by layer), or only ``names``, in that order (KeyError for a name it does not
    export); ``gather_shards`` over all ranks' triples of one name gives the Hugging Face tensor
    exactly. A tied ``lm_head`` is not exported (it is ``model.embed_tokens.weight``). Each tensor
    is new, and only the asked-for ones are built; with ``copy=False`` they may be views of
    ``local_state`` instead. ``partial``: ``local_state`` may hold only some parameters (e.g. those
    with a gradient); the tensors made from the others are left out."""
    plan = _megatron_to_hf_plan(local_state, hf_config, tp_rank, tp_size)
    if partial:
        plan = [entry for entry in plan if entry[3] in local_state]
    if names is not None:
        by_name = {entry[0]: entry for entry in plan}
        unknown = sorted(set(names) - set(by_name))
        if unknown:
            raise KeyError(f"no exported tensors {unknown}")
        plan = [by_name[name] for name in names]
    return [(name, _new(make()) if copy else make(), spec) for name, make, spec, _ in plan]
