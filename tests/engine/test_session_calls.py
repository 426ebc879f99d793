"""A session's calls in JSON (``engine.service.session_calls``): what a loop outside sends decodes
to the very arrays and parameters it had, results come back bit for bit, and each bad field is
refused by name. Pure: no Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.api import Batch, Completion, ForwardResult, LossResult, SamplingParams
from engine.errors import SpecError
from engine.service.session_calls import MAX_ROWS, decode, encode, from_result, to_args


def _over_json(value):
    return json.loads(json.dumps(value))


def test_a_batch_crosses_as_json_and_comes_back_the_same_float32_arrays():
    rng = np.random.default_rng(0)
    completions = [[5, 6, 7], [8], [9, 10]]
    old = np.zeros((3, 3), dtype=np.float32)
    for i, c in enumerate(completions):
        old[i, :len(c)] = rng.normal(size=len(c)).astype(np.float32) / 3
    batch = Batch(prompts=[[1, 2], [3], [4]], completions=completions,
                  advantages=rng.normal(size=3).astype(np.float32), old_logprobs=old)
    role, kwargs = decode("forward_backward", _over_json(to_args("forward_backward", "policy",
                                                                   {"batch": batch, "loss": "grpo"})))
    assert role == "policy"
    got = kwargs["batch"]
    for name in ("advantages", "old_logprobs"):
        assert getattr(got, name).dtype == np.float32
        assert getattr(got, name).tobytes() == getattr(batch, name).tobytes()
    assert got.ref_logprobs is None
    assert (got.prompts, got.completions) == (batch.prompts, batch.completions)


def test_sampling_params_and_results_cross_unchanged():
    sampling = SamplingParams(n=3, temperature=0.7, max_tokens=5, seed=11, stop_token_ids=(4, 9))
    sent = to_args("generate", "policy", {"prompts": [[1, 2]], "sampling": sampling})
    _, kwargs = decode("generate", _over_json(sent))
    assert kwargs["sampling"] == sampling
    completions = [Completion(0, [3, 4], "ab", [-0.25, -1.5]), Completion(0, [7], "c", [-0.1])]
    assert from_result("generate", _over_json(encode("generate", completions)), kwargs) == completions
    logprobs = np.array([[-0.3, -0.7], [-1.1, 0.0]], dtype=np.float32)
    mask = np.array([[True, True], [True, False]])
    batch = Batch(prompts=[[1], [2]], completions=[[3, 4], [5]])
    back = from_result("forward", _over_json(encode("forward", ForwardResult(logprobs, mask))), {"batch": batch})
    assert back.logprobs.tobytes() == logprobs.tobytes()
    assert (back.mask == mask).all()
    loss = LossResult(loss=0.125, tokens=3, metrics={"clip_frac": 0.5})
    assert from_result("forward_backward", _over_json(encode("forward_backward", loss)), {}) == loss


def test_where_a_checkpoint_lives_stays_in_the_engine():
    assert encode("save_checkpoint", {"path": "/srv/plexrl/jobs/x/ckpt/a"}) == {}


@pytest.mark.parametrize(("fn", "args", "field"), [
    ("generate", {"prompts": []}, "prompts"),
    ("generate", {"prompts": [[1, True]]}, "prompts[0]"),
    ("generate", {"prompts": [[1]] * (MAX_ROWS // 2 + 1), "sampling": {"n": 2}}, "sampling.n"),
    ("generate", {"prompts": [[1]], "sampling": {"temperature": -1}}, "sampling"),
    ("generate", {"prompts": [[1]], "sampling": {"top_k": 5}}, "sampling.top_k"),
    ("generate", {"prompts": [[1]], "role": "critic"}, "role"),
    ("forward", {"batch": {"prompts": [[1]], "completions": [[2], [3]]}}, "batch.completions"),
    ("forward", {"batch": {"prompts": [[1]], "completions": [[2]], "old_logprobs": [[float("nan")]]}},
     "batch.old_logprobs[0]"),
    ("forward_backward", {"batch": {"prompts": [[1]], "completions": [[2]]}, "loss": ""}, "loss"),
    ("create_model", {"trainable": False, "optimizer": {"lr": 0.1}}, "optimizer"),
    ("create_model", {"trainable": True, "optimizer": {"lr": 0}}, "optimizer"),
    ("load_checkpoint", {"tag": "a/b"}, "tag"),
    ("log_metrics", {"step": 1, "values": {"reward": "high"}}, "values.reward"),
    ("log_metrics", {"step": 1, "values": {"step": 2}}, "values.step"),
    ("log_metrics", {"step": -1, "values": {"a": 1}}, "step"),
    ("export", {"now": True}, "now"),
    ("tokenize", {"texts": ["12"], "eos": 1}, "eos"),
    ("tokenize", {"texts": [""]}, "texts"),
    ("generate", {"prompts": [[1]], "texts": ["1+1="]}, "prompts"),
    ("rm", {}, "fn"),
])
def test_each_bad_field_is_refused_by_name(fn, args, field):
    with pytest.raises(SpecError) as info:
        decode(fn, args)
    assert info.value.field == field
