"""The preset's supervised schedule converges: warm-up, a stable peak, and a decay that ends at zero."""

from __future__ import annotations

from itertools import pairwise

import pytest

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
