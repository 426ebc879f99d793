"""The presets' recipes: a supervised schedule that converges (warm-up, a stable peak, and a decay
that ends at zero), what they learn, and builds whose bytes do not depend on how they are run."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from engine.models.presets import TINY_ARITH
from engine.models.tiny import lr_at


@pytest.mark.parametrize(("total", "warm", "decay"), [(1200, 0.05, 0.05), (30, 0.05, 0.05), (100, 0.1, 0.3)])
def test_schedule_warms_holds_and_decays_to_zero(total, warm, decay):
    peak = 2e-3
    rates = [lr_at(s, total, peak, warm, decay) for s in range(total)]
    assert rates[-1] == 0.0
    assert max(rates) == pytest.approx(peak)
    top = rates.index(max(rates))
    assert all(a <= b for a, b in pairwise(rates[: top + 1]))  # warm-up rises
    assert all(a >= b for a, b in pairwise(rates[top:]))  # never rises again
    assert all(r > 0 for r in rates[:-1])


def test_preset_decays_to_zero_within_its_own_steps():
    p = TINY_ARITH
    assert lr_at(p.sft_steps - 1, p.sft_steps, p.sft_lr, p.sft_warmup, p.sft_decay) == 0.0
    assert p.head_dim >= 32  # vLLM's CPU attention rejects smaller heads


def test_tools_preset_learns_only_what_the_model_writes():
    """Tool traces teach the call and the EOS after the result, never the result the environment
    inserts (as in RL); direct answers teach the answer and EOS, as in tiny-arith."""
    from engine.models import PRESETS
    from engine.models.presets import TINY_ARITH_TOOLS
    from engine.models.tiny import _sft_batch, train_tokenizer
    from engine.tasks.arithmetic import Problem, eval_problems

    assert PRESETS["tiny-arith-tools"] is TINY_ARITH_TOOLS
    assert TINY_ARITH_TOOLS.tool_fraction > 0
    assert TINY_ARITH.tool_fraction == 0  # tiny-arith builds exactly as before the tool existed
    p = TINY_ARITH_TOOLS
    assert lr_at(p.sft_steps - 1, p.sft_steps, p.sft_lr, p.sft_warmup, p.sft_decay) == 0.0
    tok = train_tokenizer(eval_problems(50), extra="[]?")
    ids, attn, labels = _sft_batch(tok, [Problem("37+45-12=", "70"), Problem("3-5=", "-2")], [True, False])
    texts = [tok.decode(row[mask.bool()].tolist()) for row, mask in zip(ids, attn, strict=True)]
    learned = [tok.decode(row[row != -100].tolist()) for row in labels]
    assert texts == ["37+45-12=[37+45-12]70<eos>", "3-5=-2<eos>"]
    assert learned == ["[37+45-12]<eos>", "-2<eos>"]


def test_a_saved_tokenizer_loads_as_it_was_saved(tmp_path):
    """A Qwen2 config makes ``AutoTokenizer`` pick transformers' Qwen2 tokenizer, which rebuilds its
    own pre-tokenizer (one digit per token). ``load_tokenizer`` must return the saved pipeline: here
    one that keeps whole numbers, which the Qwen2 class would split into digits."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    from engine.workers.tokenizer import load_tokenizer

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d+|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.train_from_iterator(["37+45=82"], trainer=trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"]))
    saved = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                    padding_side="left")
    saved.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=16, hidden_size=32, num_attention_heads=1, num_key_value_heads=1).save_pretrained(tmp_path)

    loaded = load_tokenizer(tmp_path)
    assert loaded.convert_ids_to_tokens(loaded.encode("37+45=82")) == ["37", "+", "45", "=", "82"]
    assert loaded.encode("37+45=82") == saved.encode("37+45=82")
    assert loaded.eos_token == "<eos>"
    assert loaded.padding_side == "left"


def _short(preset):
    return dataclasses.replace(preset, sft_steps=20, eval_size=10)


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def test_a_presets_bytes_do_not_depend_on_how_many_threads_build_it(tmp_path):
    """What lets ``build_presets`` build several presets side by side on fewer threads each."""
    from engine.models.presets import TINY_ARITH_TOOLS
    from engine.models.tiny import build_preset

    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            build_preset(dataclasses.replace(_short(TINY_ARITH_TOOLS), threads=n), tmp_path / f"threads{n}")
    finally:
        torch.set_num_threads(threads)
    assert _weights(tmp_path / "threads1") == _weights(tmp_path / "threads2")


def test_missing_presets_are_built_side_by_side_as_each_would_be_alone(tmp_path, monkeypatch):
    import engine.models
    from engine.models.presets import TINY_ARITH_TOOLS
    from engine.models.tiny import build_preset

    recipes = {p.name: _short(p) for p in (TINY_ARITH, TINY_ARITH_TOOLS)}
    monkeypatch.setattr(engine.models, "PRESETS", recipes)
    monkeypatch.setenv("PLEXRL_HOME", str(tmp_path / "home"))
    assert engine.models.build_presets(["tiny-arith-tools", "tiny-arith", "tiny-arith"]) == sorted(recipes)
    threads = torch.get_num_threads()
    try:
        for name, recipe in recipes.items():  # alone, on the recipe's own threads
            build_preset(recipe, tmp_path / "alone" / name)
            assert _weights(engine.models.preset_dir(name)) == _weights(tmp_path / "alone" / name), name
    finally:
        torch.set_num_threads(threads)
    assert engine.models.build_presets(list(recipes)) == []  # built once
