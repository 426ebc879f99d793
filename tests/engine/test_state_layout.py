"""Hugging Face Qwen2, Llama and Qwen3 <-> Megatron GPTModel conversion and shard gathering (pure tensors,
no Ray)."""

from __future__ import annotations

import pytest
import torch

from engine.state.layout import (
    WHOLE,
    ShardSpec,
    gather_shards,
    hf_to_megatron,
    megatron_hf_names,
    megatron_param_parts,
    megatron_partition_dim,
    megatron_to_hf,
)


def qwen2_config(*, heads: int, kv_heads: int, tied: bool, vocab: int = 64):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16,
        tie_word_embeddings=tied, max_position_embeddings=64,
    )


def random_hf_tensors(config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor a Qwen2ForCausalLM checkpoint holds (a tied lm_head left out), random values."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    names = {k: v.shape for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings:
        names.pop("lm_head.weight")
    return {k: torch.randn(shape) for k, shape in names.items()}


KINDS = {  # (heads, kv_heads, tied) -> the tensor parallel sizes that split it
    (4, 4, True): (1, 2, 4),  # multi-head attention, one query head per group
    (4, 2, True): (1, 2),  # grouped-query attention
    (8, 4, False): (1, 2, 4),  # grouped-query attention, untied lm_head
}
CASES = [
    pytest.param(heads, kv, tied, tp, id=f"h{heads}-kv{kv}-{'tied' if tied else 'untied'}-tp{tp}")
    for (heads, kv, tied), tps in KINDS.items()
    for tp in tps
]


@pytest.mark.parametrize(("heads", "kv_heads", "tied", "tp"), CASES)
def test_hf_megatron_round_trip_is_exact(heads, kv_heads, tied, tp):
    config = qwen2_config(heads=heads, kv_heads=kv_heads, tied=tied)
    hf = random_hf_tensors(config)
    shards: dict[str, list[tuple[torch.Tensor, ShardSpec]]] = {}
    for rank in range(tp):
        local = hf_to_megatron(hf, config, rank, tp)
        for name, tensor, spec in megatron_to_hf(local, config, rank, tp):
            assert spec == WHOLE or spec == ShardSpec(spec.dim, rank, tp)
            shards.setdefault(name, []).append((tensor, spec))
    assert set(shards) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(gather_shards(shards[name]), tensor), name


def other_config(arch: str, tied: bool):
    from transformers import LlamaConfig, Qwen3Config

    kind = {"llama": LlamaConfig, "qwen3": Qwen3Config}[arch]
    return kind(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied, max_position_embeddings=64)


def random_tensors_of(config, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    names = {k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if config.tie_word_embeddings:
        names.pop("lm_head.weight")
    return {k: torch.randn(shape) for k, shape in names.items()}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("llama", True), ("qwen3", True), ("qwen3", False)])
def test_llama_and_qwen3_round_trip_exactly_without_qkv_biases_and_with_qwen3s_qk_norms(arch, tied, tp):
    config = other_config(arch, tied)
    hf = random_tensors_of(config)
    assert not any(name.endswith("_proj.bias") for name in hf)
    assert any(name.endswith("q_norm.weight") for name in hf) == (arch == "qwen3")
    shards: dict[str, list[tuple[torch.Tensor, ShardSpec]]] = {}
    for rank in range(tp):
        local = hf_to_megatron(hf, config, rank, tp)
        assert any(n.endswith("q_layernorm.weight") for n in local) == (arch == "qwen3")
        for name, tensor, spec in megatron_to_hf(local, config, rank, tp):
            shards.setdefault(name, []).append((tensor, spec))
    assert set(shards) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(gather_shards(shards[name]), tensor), name


@pytest.mark.parametrize(("heads", "kv_heads", "tied", "tp"), CASES)
def test_a_rank_builds_its_parameters_from_its_own_slices(heads, kv_heads, tied, tp):
    config = qwen2_config(heads=heads, kv_heads=kv_heads, tied=tied)
    hf = random_hf_tensors(config)
    for rank in range(tp):
        parts = megatron_param_parts(config, rank, tp)
        keys = [key for mg in parts.values() for key in mg]
        assert keys == [(name, spec) for name, _, spec in megatron_to_hf(hf_to_megatron(hf, config, rank, tp),
                                                                         config, rank, tp)]
        # only this rank's slices, cut by their specs: nothing else of the full tensors is given
        mine = {name: hf[name] if spec == WHOLE else hf[name].chunk(spec.count, spec.dim)[spec.index].clone()
                for name, spec in keys}
        expected = hf_to_megatron(hf, config, rank, tp)
        got = hf_to_megatron(mine, config, rank, tp, sliced=True)
        assert got.keys() == expected.keys() == parts.keys()
        assert all(torch.equal(got[n], t) for n, t in expected.items())
        # partial: a parameter whose slices are not all given is left out (else KeyError)
        del mine["model.layers.0.self_attn.k_proj.weight"]
        with pytest.raises(KeyError):
            hf_to_megatron(mine, config, rank, tp, sliced=True)
        some = hf_to_megatron(mine, config, rank, tp, sliced=True, partial=True)
        assert set(expected) - set(some) == {"decoder.layers.0.self_attention.linear_qkv.weight"}
        # and back: only the tensors made from the given parameters
        back = megatron_to_hf(some, config, rank, tp, partial=True)
        assert {name for name, _, _ in back} == {name for name, _ in keys} - {
            f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkv"}


def test_megatron_to_hf_converts_only_the_names_asked_for():
    config = qwen2_config(heads=4, kv_heads=2, tied=False)
    local = hf_to_megatron(random_hf_tensors(config), config, 1, 2)
    everything = megatron_to_hf(local, config, 1, 2)
    assert megatron_hf_names(config, 2) == [name for name, _, _ in everything]
    wanted = ["model.layers.1.self_attn.v_proj.bias", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"]
    picked = megatron_to_hf(local, config, 1, 2, wanted)
    assert [name for name, _, _ in picked] == wanted
    full = {name: (t, spec) for name, t, spec in everything}
    for name, tensor, spec in picked:
        assert torch.equal(tensor, full[name][0])
        assert spec == full[name][1]
    with pytest.raises(KeyError, match="no exported tensors"):
        megatron_to_hf(local, config, 1, 2, ["model.layers.9.mlp.up_proj.weight"])


def test_megatron_tensor_shapes_and_qkv_group_interleaving():
    config = qwen2_config(heads=4, kv_heads=2, tied=True)
    hf = random_hf_tensors(config)
    d = 16  # head_dim
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    # TP=1: per query group g, [2 query heads of g, k_g, v_g]
    qkv = hf_to_megatron(hf, config, 0, 1)["decoder.layers.0.self_attention.linear_qkv.weight"]
    expected = torch.cat([q[:2 * d], k[:d], v[:d], q[2 * d:], k[d:], v[d:]])
    assert torch.equal(qkv, expected)
    # TP=2: rank 1 holds group 1 only, and half of every split dimension
    local = hf_to_megatron(hf, config, 1, 2)
    assert torch.equal(local["decoder.layers.0.self_attention.linear_qkv.weight"], torch.cat([q[2 * d:], k[d:], v[d:]]))
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(local["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[48:], up[48:]]))
    assert local["decoder.layers.0.self_attention.linear_proj.weight"].shape == (64, 32)
    assert local["decoder.layers.0.mlp.linear_fc2.weight"].shape == (64, 48)
    assert local["embedding.word_embeddings.weight"].shape == (32, 64)
    assert "output_layer.weight" not in local  # tied: the output layer is the embedding


def test_partition_dims_describe_the_split():
    config = qwen2_config(heads=8, kv_heads=4, tied=False)
    full = hf_to_megatron(random_hf_tensors(config), config, 0, 1)
    half = hf_to_megatron(random_hf_tensors(config), config, 0, 2)
    for name, tensor in full.items():
        dim = megatron_partition_dim(name)
        if dim is None:
            assert half[name].shape == tensor.shape, name
        else:
            assert half[name].shape[dim] * 2 == tensor.shape[dim], name
    with pytest.raises(KeyError):
        megatron_partition_dim("decoder.layers.0.mlp.router.weight")


def test_exported_shards_do_not_alias_the_source():
    config = qwen2_config(heads=4, kv_heads=2, tied=False)
    local = hf_to_megatron(random_hf_tensors(config), config, 0, 2)
    before = {k: v.clone() for k, v in local.items()}
    for _, tensor, _ in megatron_to_hf(local, config, 0, 2):
        tensor.add_(1.0)
    assert all(torch.equal(local[k], before[k]) for k in local)
    # copy=False: the same values, as views where the layout allows (no copy of the parameters)
    views = megatron_to_hf(local, config, 0, 2, copy=False)
    copies = megatron_to_hf(local, config, 0, 2)
    assert all(torch.equal(v, c) for (_, v, _), (_, c, _) in zip(views, copies, strict=True))
    assert views[0][1].data_ptr() == local["embedding.word_embeddings.weight"].data_ptr()


def test_layouts_that_do_not_split_are_rejected():
    with pytest.raises(ValueError, match="vocab_size=63 is not divisible"):
        hf_to_megatron({}, qwen2_config(heads=4, kv_heads=2, tied=True, vocab=63), 0, 2)
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible"):
        hf_to_megatron({}, qwen2_config(heads=4, kv_heads=2, tied=True), 0, 4)
