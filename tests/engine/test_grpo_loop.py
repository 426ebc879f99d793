"""The GRPO loop (``engine.rl.grpo.train``) in this process, over the session's worker group.

The 250-step test model is rarely right on arithmetic, so most groups' rewards would be equal and
no update would ever run; these tests swap in a reward it can earn (an answer that starts with
"1") so that the whole step runs: rollouts, rewards, advantages, old-policy (and reference)
log-probs, minibatch updates and the weight sync.
"""

import numpy as np
import pytest

from engine.client import Batch, Client, ModelHandle, SamplingParams
from engine.rl import grpo
from engine.service.eventlog import EventLog, read_events

CONFIG = grpo.GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, lr=1e-3,
                         max_tokens=4, eval_every=1, eval_size=10)


def _starts_with_one(response: str, answer: str) -> float:
    return 1.0 if response.strip().startswith("1") else 0.0


@pytest.fixture
def run_grpo(router, tmp_path, monkeypatch):
    """``run_grpo(job, steps, **config) -> (summary, events)`` with the swapped-in reward."""
    monkeypatch.setattr(grpo, "math_reward", _starts_with_one)

    def run(job: str, steps: int = 2, **overrides):
        path = tmp_path / f"{job}.jsonl"
        events = EventLog(path)
        config = grpo.GRPOConfig(**{**CONFIG.__dict__, **overrides})
        summary = grpo.train(Client(router, events), job=job, model="tiny-arith", task="arith", steps=steps,
                             seed=0, config=config)
        events.close()
        return summary, read_events(path)

    return run


def _metrics(events) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == "metrics"]


def test_steps_update_and_sync_the_policy(run_grpo, router, job, tiny_model_dir):
    summary, events = run_grpo(job)
    metrics = _metrics(events)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0 < m["reward_mean"] < 1
        assert m["train_accuracy"] == m["reward_mean"]
        assert m["groups_used"] > 0
        assert m["grad_norm"] > 0
        assert m["clip_frac"] >= 0
        assert m["kl"] >= 0
        assert "eval_accuracy" in m
        assert "eval_well_formed" in m
    assert sum(e["kind"] == "timings" for e in events) == 2
    assert any(e["kind"] == "log" and "initial held-out accuracy" in e["data"]["message"] for e in events)
    assert summary["steps"] == 2
    assert summary["seed"] == 0
    assert summary["config"]["prompts_per_step"] == 8

    # the last step synced: the sampler's log-probs are the trainer's
    policy = ModelHandle(router, job, "policy", tiny_model_dir)
    out = policy.generate([[3, 4, 5]], SamplingParams(n=4, temperature=1.0, max_tokens=4, seed=1)).result()
    forward = policy.forward(Batch([[3, 4, 5]] * 4, [c.token_ids for c in out])).result()
    for i, c in enumerate(out):
        np.testing.assert_allclose(forward.logprobs[i, : len(c.logprobs)], c.logprobs, atol=1e-4, rtol=0)
    assert (job, "reference") not in router.placement  # kl_coef 0 needs no reference


def test_same_seed_same_metrics(run_grpo, job):
    _, first = run_grpo(f"{job}-a")
    _, second = run_grpo(f"{job}-b")
    assert _metrics(first) == _metrics(second)


def test_kl_penalty_adds_a_frozen_reference(run_grpo, router, job):
    _, events = run_grpo(job, steps=1, kl_coef=0.1)
    assert router.placement.keys() >= {(job, "policy"), (job, "reference")}
    (metrics,) = _metrics(events)
    assert metrics["groups_used"] > 0
    # in the step's first update the policy still equals the reference; later ones moved away from it
    assert 0 <= metrics["kl"] < 0.1


def test_old_logprobs_from_the_rollout_match_a_recomputation(run_grpo, job, client, tiny_model_dir):
    """By default the old policy's log-probs are those generate returned; recomputing them with a
    trainer forward pass gives the same values, hence (nearly) the same losses."""
    policy = client.create_model(f"{job}-probe", "policy", str(tiny_model_dir), trainable=True)
    out = policy.generate([[3, 4, 5], [6, 7]], SamplingParams(n=3, temperature=1.0, max_tokens=4, seed=2)).result()
    laid_out = grpo.rollout_logprobs(out)
    forward = policy.forward(Batch([[3, 4, 5]] * 3 + [[6, 7]] * 3, [c.token_ids for c in out])).result()
    assert laid_out.shape == forward.logprobs.shape
    np.testing.assert_allclose(laid_out, forward.logprobs, atol=1e-4, rtol=0)  # zeros where the mask is off

    _, reused = run_grpo(f"{job}-reuse", steps=1)
    _, recomputed = run_grpo(f"{job}-recompute", steps=1, recompute_logprobs=True)
    (a,), (b,) = _metrics(reused), _metrics(recomputed)
    assert a["reward_mean"] == b["reward_mean"]
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
