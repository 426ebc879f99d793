"""``check_model_folder``: what the engine takes from a tenant, read without running anything in it.
(The refusals a tenant meets through the upload are in tests/platform/test_model_uploads.)"""

from __future__ import annotations

import shutil

import pytest

from engine.errors import ModelInvalid
from engine.models.check import check_model_folder
from tests.modelfiles import VOCAB, build_tiny_model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    return {tied: build_tiny_model(root / f"tied-{tied}", "qwen2", tied=tied) for tied in (True, False)}


@pytest.mark.parametrize("tied", [True, False])
def test_a_saved_model_passes_with_its_facts(folders, tied):
    facts = check_model_folder(folders[tied])
    # this Qwen2's head_dim (32) is not hidden_size / heads (16), which vLLM's Qwen2 assumes
    assert (facts["architecture"], facts["backends"], facts["dtype"], facts["tied_embeddings"]) == (
        "Qwen2ForCausalLM", ["megatron", "torch"], "float32", tied)
    assert facts["parameters"] == 103232 + (0 if tied else len(VOCAB) * 64)  # an untied output layer of its own


def test_an_untied_model_needs_its_output_layer(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(folders[False], tmp_path / "m")
    tensors = load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelInvalid, match=r"the weights lack tensor lm_head\.weight"):
        check_model_folder(folder)


def test_a_tokenizer_bigger_than_the_vocabulary_is_refused(tmp_path):
    folder = build_tiny_model(tmp_path / "m", "qwen2", vocab_size=10)
    with pytest.raises(ModelInvalid, match=f"the tokenizer has {len(VOCAB)} tokens but config.json's vocab_size is 10"):
        check_model_folder(folder)


def test_subfolders_and_stray_files_are_refused(folders, tmp_path):
    folder = shutil.copytree(folders[True], tmp_path / "m")
    (folder / "extra").mkdir()
    with pytest.raises(ModelInvalid, match="extra/: a model folder holds files only"):
        check_model_folder(folder)
    (folder / "extra").rmdir()
    (folder / "weights.tar").write_bytes(b"x")
    with pytest.raises(ModelInvalid, match=r"weights\.tar: not a file a model folder holds"):
        check_model_folder(folder)


def test_what_a_backend_needs_of_a_configuration():
    from engine.models.check import configuration_problem

    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 64,
             "hidden_act": "silu"}
    assert all(configuration_problem(llama, b) is None for b in ("torch", "vllm", "megatron"))
    assert configuration_problem(llama, "megatron", tp=2) is None
    assert "is not divisible by tensor parallel size 4" in configuration_problem(llama, "megatron", tp=4)
    assert "'llama3'" in configuration_problem({**llama, "rope_scaling": {"rope_type": "llama3"}}, "megatron")
    assert "attention biases" in configuration_problem({**llama, "attention_bias": True}, "megatron")
    assert "the torch backend runs" in configuration_problem({**llama, "architectures": ["GPT2LMHeadModel"]}, "torch")
    qwen2 = {**llama, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "head_dim": 32}
    assert "head_dim as hidden_size / num_attention_heads (16)" in configuration_problem(qwen2, "vllm")
    assert configuration_problem({**qwen2, "head_dim": 16}, "vllm") is None
