"""A job's driver encodes with ``PlainTokenizer`` (the ``tokenizers`` library, no torch): it must give
the ids transformers' tokenizer gives for the same folder, or a driver's prompts would differ from
what the workers and every earlier run saw."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from engine.tasks.registry import get_task
from engine.tasks.tools import ERROR_MARKER
from engine.workers.tokenizer import PlainTokenizer, load_plain_tokenizer, load_tokenizer


@pytest.fixture(params=["tiny_model_dir", "tiny_tools_model_dir"])
def model_dir(request):
    return request.getfixturevalue(request.param)


def _texts() -> list[str]:
    """Every kind of text a driver encodes: both tasks' training and eval prompts, tool results
    (digits, negatives, the error marker), and text with the special tokens written out."""
    rng = np.random.default_rng(0)
    prompts = [p.prompt for name in ("arith", "arith-tools") for p in
               (*get_task(name).train_batch(seed=3, step=1, n=64), *get_task(name).eval_set(32))]
    results = [str(int(v)) for v in rng.integers(-10**12, 10**12, size=32)] + [ERROR_MARKER, "0", ""]
    return [*prompts, *results, "12+7=<eos>", "<pad><unk> 3 + 4 ="]


def test_plain_encodings_are_transformers(model_dir):
    plain, full = PlainTokenizer(model_dir), load_tokenizer(model_dir)
    for text in _texts():
        for special in (True, False):
            assert plain.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special), text
    assert plain.get_vocab() == full.get_vocab()
    assert len(plain) == len(full)
    assert (plain.eos_token_id, plain.pad_token_id) == (full.eos_token_id, full.pad_token_id)
    assert plain.eos_token_id is not None
    ids = full.encode("37+45-12=70")
    assert plain.decode(ids) == full.decode(ids)


def test_a_folder_without_tokenizer_json_falls_back_to_transformers(tmp_path, tiny_model_dir):
    assert isinstance(load_plain_tokenizer(tiny_model_dir), PlainTokenizer)
    # nothing to load there: transformers' own error, not a silent empty tokenizer
    with pytest.raises((OSError, ValueError), match="tokenizer"):
        load_plain_tokenizer(tmp_path)


def test_encoding_a_prompt_loads_no_torch(tiny_model_dir):
    code = ("import sys; from engine.client import Client; from engine.workers.tokenizer import load_plain_tokenizer; "
            f"load_plain_tokenizer({str(tiny_model_dir)!r}).encode('12+7='); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
