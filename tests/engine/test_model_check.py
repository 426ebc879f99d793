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
    assert (facts["architecture"], facts["backends"], facts["dtype"], facts["tied_embeddings"]) == (
        "Qwen2ForCausalLM", ["megatron", "torch", "vllm"], "float32", tied)
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
