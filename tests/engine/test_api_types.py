"""The plain data that crosses the function API validates itself; ``Batch.select`` keeps rows aligned."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from engine.api import Batch, OptimizerConfig, Request, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n": 0}, "n must be"), ({"temperature": -0.1}, "temperature"), ({"max_tokens": 0}, "max_tokens")],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_defaults():
    params = SamplingParams()
    assert (params.n, params.temperature, params.seed) == (1, 1.0, 0)
    SamplingParams(temperature=0.0)  # greedy is allowed


@pytest.mark.parametrize("lr", [0.0, -1e-3])
def test_optimizer_config_needs_a_positive_lr(lr):
    with pytest.raises(ValueError, match="lr"):
        OptimizerConfig(lr=lr)


def test_batch_needs_matching_rows():
    with pytest.raises(ValueError, match="as many prompts as completions"):
        Batch(prompts=[[1], [2]], completions=[[3]])
    with pytest.raises(ValueError, match="at least one"):
        Batch(prompts=[], completions=[])
    assert len(Batch(prompts=[[1], [2]], completions=[[3], [4, 5]])) == 2


def test_batch_select_keeps_loss_inputs_aligned():
    batch = Batch(
        prompts=[[1], [2, 2], [3]],
        completions=[[7, 7, 7, 7], [8], [9, 9]],
        advantages=torch.tensor([0.5, -1.0, 2.0]),
        old_logprobs=torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-5.0, 0, 0, 0], [-6.0, -7.0, 0, 0]]),
        ref_logprobs=torch.arange(12, dtype=torch.float32).reshape(3, 4),
    )
    sub = batch.select([2, 1])
    assert sub.prompts == [[3], [2, 2]]
    assert sub.completions == [[9, 9], [8]]
    np.testing.assert_array_equal(sub.advantages, [2.0, -1.0])
    # per-token inputs are trimmed to the sub-batch's own longest completion
    np.testing.assert_array_equal(sub.old_logprobs, [[-6.0, -7.0], [-5.0, 0.0]])
    np.testing.assert_array_equal(sub.ref_logprobs, [[8.0, 9.0], [4.0, 5.0]])
    bare = Batch(prompts=[[1], [2]], completions=[[3], [4]]).select([1])
    assert bare.advantages is None
    assert bare.old_logprobs is None
    assert bare.ref_logprobs is None


def test_request_names_its_deployment():
    request = Request(job="j", role="policy", fn="forward", payload={})
    assert request.deployment == ("j", "policy")
    assert request.estimate_s is None


def test_optimizer_schedule_warms_up_then_decays_to_zero():
    from itertools import pairwise

    cfg = OptimizerConfig(lr=1e-3, warmup_steps=4, decay_steps=20)
    rates = [cfg.lr_at(s) for s in range(20)]
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert rates[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in pairwise(rates[4:]))
    assert rates[19] == pytest.approx(0.0, abs=1e-12)
    assert OptimizerConfig(lr=1e-3).lr_at(10_000) == 1e-3  # constant without decay_steps


def test_loss_inputs_cross_the_api_as_numpy_arrays():
    """A list becomes a float32 array, a float tensor or array keeps its dtype, bit for bit: a
    driver that builds batches needs no torch, and a backend gets the same numbers either way."""
    values = [0.1, -1.0 / 3.0, 2.5]
    from_list = Batch(prompts=[[1]] * 3, completions=[[2]] * 3, advantages=values)
    from_torch = Batch(prompts=[[1]] * 3, completions=[[2]] * 3, advantages=torch.tensor(values))
    for batch in (from_list, from_torch):
        assert isinstance(batch.advantages, np.ndarray)
        assert batch.advantages.dtype == np.float32
    assert from_list.advantages.tobytes() == from_torch.advantages.tobytes()
    wide = Batch(prompts=[[1]] * 3, completions=[[2]] * 3, advantages=torch.tensor(values, dtype=torch.float64))
    assert wide.advantages.dtype == np.float64
    assert wide.advantages.tolist() == values
    assert Batch(prompts=[[1]], completions=[[2]], advantages=[1]).advantages.dtype == np.float32


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("advantages", [[1.0], [2.0]], r"advantages must have shape \[B\] with B = 2 rows, got \[2, 1\]"),
     ("advantages", [1.0, 2.0, 3.0], r"B = 2 rows, got \[3\]"),
     ("old_logprobs", [1.0, 2.0], r"old_logprobs must have shape \[B, T\]"),
     ("ref_logprobs", np.zeros((3, 4)), r"ref_logprobs must have shape \[B, T\] with B = 2 rows, got \[3, 4\]")],
)
def test_loss_inputs_of_the_wrong_shape_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        Batch(prompts=[[1], [2]], completions=[[3], [4]], **{field: value})


def test_a_job_driver_and_its_algorithm_import_no_torch():
    """What a job's driver process loads (the driver actor, the GRPO loop, the client and router,
    the worker group handles) imports without torch: a driver stays small."""
    code = ("import sys, engine.service.driver, engine.rl.grpo, engine.client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'megatron')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
