"""Pre-run estimates (``engine.accounting.estimate``): the plan follows the GRPO loop call for call, the seconds
come from the shipped calibration or a profile of the same shape, and the predicted usage bills
through the same savings function as measured usage. Pure: no Ray, no worker group."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.accounting.estimate import (
    estimate,
    expected_max,
    kept_fraction,
    load_calibration,
    model_estimate,
    plan,
    read_profile,
    shape_key,
    write_profile,
)
from engine.accounting.metering import record_rows, savings_of_rows
from engine.spec import GRPOConfig, JobSpec
from engine.tasks.tools import ToolConfig

SPEC = JobSpec(task="arith", model="tiny-arith", steps=20, rollout="torch", trainer="torch",
               grpo=GRPOConfig(prompts_per_step=8, samples_per_prompt=4, eval_every=10, eval_size=100))


def calls_of(spec: JobSpec) -> dict[tuple[str, str], dict]:
    planned, _, _ = plan(spec, load_calibration())
    out: dict[tuple[str, str], dict] = {}
    for c in planned:
        entry = out.setdefault((c.role, c.fn), {"count": 0.0, "wpgs": set()})
        entry["count"] += c.count
        entry["wpgs"] |= set(c.wpgs)
    return out


def test_the_plan_makes_the_calls_the_grpo_loop_makes():
    calls = calls_of(SPEC)
    assert calls[("policy", "create")] == {"count": 2, "wpgs": {"train", "rollout"}}  # both sides of a split
    assert calls[("policy", "generate")]["count"] == 20 + 3  # a rollout per step; evaluations at 0, 10, 20
    assert calls[("policy", "sync_weights")] == {"count": 20, "wpgs": {"train", "rollout"}}
    assert calls[("policy", "save_checkpoint")]["count"] == 2  # at step 10 (checkpoint_every) and the final one
    assert calls[("policy", "forward_backward")]["count"] == calls[("policy", "optim_step")]["count"] <= 20 * 8
    assert ("policy", "forward") not in calls
    assert ("reference", "create") not in calls
    passes = dataclasses.replace(SPEC, grpo=dataclasses.replace(SPEC.grpo, kl_coef=0.05, recompute_logprobs=True))
    calls = calls_of(passes)
    assert calls[("policy", "forward")]["count"] == calls[("reference", "forward")]["count"] == 20
    assert calls[("reference", "create")] == {"count": 1, "wpgs": {"train"}}


def test_a_tool_task_generates_per_turn_and_waits_on_the_tool():
    tools = JobSpec(task="arith-tools", steps=10, rollout="torch", trainer="torch",
                    grpo=GRPOConfig(prompts_per_step=8, samples_per_prompt=4, eval_size=100))
    quiet = dataclasses.replace(tools, tools=ToolConfig(latency_median_s=0.0, latency_p99_s=0.0))
    assert calls_of(tools)[("policy", "generate")]["count"] > 10 + 2
    slow, fast = estimate(tools), estimate(quiet)
    assert slow.held_seconds == pytest.approx(fast.held_seconds)  # a stall holds no group: nobody pays it
    assert slow.gap_seconds > fast.gap_seconds + 10  # but a dedicated deployment waits through it


def test_kept_fraction_is_the_chance_a_group_has_mixed_rewards():
    assert kept_fraction(0.0, 4) == 0.0
    assert kept_fraction(1.0, 8) == 0.0
    assert kept_fraction(0.5, 2) == pytest.approx(0.5)
    assert kept_fraction(0.1, 8) > kept_fraction(0.1, 4)


def test_expected_max_matches_sampling():
    rng = np.random.default_rng(0)
    sigma = np.log(5.0) / 2.326
    draws = rng.lognormal(0.0, sigma, size=(20000, 8)).max(axis=1)
    assert expected_max(1.0, sigma, 8) == pytest.approx(draws.mean(), rel=0.03)
    assert expected_max(1.0, sigma, 1) == pytest.approx(np.exp(sigma ** 2 / 2), rel=0.02)
    assert expected_max(0.0, sigma, 8) == 0.0


def test_bigger_jobs_cost_more_and_the_estimate_scales_with_steps(tmp_path):
    base = estimate(SPEC, home=tmp_path)
    assert base.basis == "model"
    longer = estimate(dataclasses.replace(SPEC, steps=40), home=tmp_path)
    wider = estimate(dataclasses.replace(SPEC, grpo=dataclasses.replace(SPEC.grpo, prompts_per_step=64)),
                     home=tmp_path)
    assert longer.held_seconds > base.held_seconds
    assert wider.held_seconds > base.held_seconds
    assert base.step_seconds == pytest.approx(base.wall_seconds / 20)


def test_predicted_usage_bills_like_measured_usage(tmp_path):
    predicted = estimate(SPEC, home=tmp_path)
    records = predicted.usage_records(devices_per_group=0.5)
    figures = savings_of_rows(record_rows(records), 2, "isolated_split")
    sync = sum(c.seconds for c in predicted.calls if c.fn == "sync_weights")
    assert figures["billed_device_hours"] == pytest.approx(0.5 * (predicted.held_seconds + sync) / 3600)
    assert figures["isolated_wall_seconds"] == pytest.approx(predicted.wall_seconds)
    assert figures["counterfactual_device_hours"] == pytest.approx(2 * predicted.wall_seconds / 3600)
    overlapped = savings_of_rows(record_rows(records), 2, "async_split")
    assert overlapped["counterfactual_device_hours"] < figures["counterfactual_device_hours"]


def test_a_profile_of_the_same_shape_scales_the_model(tmp_path):
    predicted = estimate(SPEC, home=tmp_path)
    # a finished run of the shape whose generate calls took three times what the model said
    usage = [r._replace(end=r.start + (3 if r.fn == "generate" else 1) * r.seconds).to_dict()
             for r in predicted.usage_records()]
    path = write_profile(SPEC, usage, home=tmp_path)
    assert path == tmp_path / "profiles" / f"{shape_key(SPEC)}.json"
    assert read_profile(dataclasses.replace(SPEC, seed=5, steps=7), home=tmp_path) is not None  # same shape
    again = estimate(dataclasses.replace(SPEC, seed=5), home=tmp_path)
    assert again.basis == "profile"
    by_fn = {c.fn: c.seconds for c in again.calls if c.role == "policy"}
    model = {c.fn: c.seconds for c in predicted.calls if c.role == "policy"}
    assert by_fn["generate"] == pytest.approx(3 * model["generate"])
    assert by_fn["forward_backward"] == pytest.approx(model["forward_backward"])
    other = dataclasses.replace(SPEC, grpo=dataclasses.replace(SPEC.grpo, samples_per_prompt=8))
    assert shape_key(other) != shape_key(SPEC)
    assert estimate(other, home=tmp_path).basis == "model"


def test_an_unreadable_profile_is_no_profile(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / f"{shape_key(SPEC)}.json").write_text("{not json")
    assert estimate(SPEC, home=tmp_path).basis == "model"
    assert write_profile(SPEC, [], home=tmp_path) is None  # a job that made no call leaves nothing


def test_a_bad_spec_names_the_field():
    from engine.errors import SpecError

    with pytest.raises(SpecError, match="steps"):
        estimate({"task": "arith", "steps": 0})


def test_a_step_trains_on_as_many_minibatches_as_it_has_rows():
    from engine.accounting.estimate import _expected_updates

    assert _expected_updates(8, 0.0, 4, 8) == 0.0  # no group kept: nothing to train on
    assert _expected_updates(8, 1.0, 4, 8) == 8.0
    assert 0 < _expected_updates(8, 0.2, 4, 8) < 8  # sometimes fewer rows than minibatches
    assert _expected_updates(4096, 0.9, 8, 8) == pytest.approx(8.0)  # thousands of prompts do not underflow


def test_checkpoints_are_planned_as_the_loop_saves_them():
    def saves(steps: int, every: int) -> float:
        spec = dataclasses.replace(SPEC, steps=steps, grpo=dataclasses.replace(SPEC.grpo, checkpoint_every=every))
        return calls_of(spec)[("policy", "save_checkpoint")]["count"]

    assert saves(20, 10) == 2  # step 10, then the final one (none at step 20 besides it)
    assert saves(25, 10) == 3
    assert saves(9, 10) == 1
    assert saves(20, 0) == 1  # periodic checkpoints off: the final one only


def test_every_backend_and_pair_is_calibrated():
    """A backend a job may name without constants would make its estimate fail at submission."""
    from engine.spec import ROLLOUT_BACKENDS, TRAINER_BACKENDS

    calibration = load_calibration()
    for rollout in ROLLOUT_BACKENDS:
        assert {"generate", "create_rollout"} <= set(calibration["backends"][rollout]), rollout
        for trainer in TRAINER_BACKENDS:
            assert "sync_weights" in calibration["pairs"][f"{rollout}+{trainer}"], (rollout, trainer)
    for trainer in TRAINER_BACKENDS:
        assert {"create", "create_reference", "forward", "forward_backward", "optim_step",
                "save_checkpoint"} <= set(calibration["backends"][trainer]), trainer


def test_each_call_is_timed_by_the_backend_that_runs_it():
    from engine.accounting.estimate import call_constants

    calibration = {"tasks": load_calibration()["tasks"], "host": {"per_job": 0, "per_step": 0, "per_eval_answer": 0},
                   "backends": {}, "pairs": {}}
    fns = ("create", "create_rollout", "create_reference", "generate", "forward", "forward_backward", "optim_step",
           "save_checkpoint")
    for n, backend in enumerate(("torch", "vllm", "megatron"), start=1):
        calibration["backends"][backend] = {fn: {"per_call": float(n), "per_unit": 0.0} for fn in fns}
    for pair, seconds in (("vllm+megatron", 7.0), ("torch+torch", 5.0)):
        calibration["pairs"][pair] = {"sync_weights": {"per_call": seconds}}
    spec = dataclasses.replace(SPEC, rollout="vllm", trainer="megatron")
    timed = model_estimate(spec, calibration)
    per_call = {(c.role, c.fn, c.wpgs): c.seconds / c.count for c in timed.calls}
    assert per_call[("policy", "generate", ("rollout",))] == 2.0  # vLLM's
    assert per_call[("policy", "create", ("rollout",))] == 2.0
    assert per_call[("policy", "create", ("train",))] == 3.0  # Megatron's
    assert per_call[("policy", "forward_backward", ("train",))] == 3.0
    assert per_call[("policy", "sync_weights", ("rollout", "train"))] == 7.0  # the pair's
    plain = model_estimate(SPEC, calibration)
    assert {c.seconds / c.count for c in plain.calls if c.fn != "sync_weights"} == {1.0}
    with pytest.raises(KeyError):  # a pair nobody calibrated is no silent zero
        call_constants(dataclasses.replace(SPEC, rollout="torch", trainer="megatron"),
                       next(c for c in plain.calls if c.fn == "sync_weights"), calibration)


def test_a_dataset_job_evaluates_no_more_problems_than_its_held_out_set(tmp_path):
    import json

    from engine.tasks.datasets import DatasetTask

    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(300)))
    held_out = len(DatasetTask(path).test)
    assert 0 < held_out < 100
    spec = JobSpec(task="dataset", model="tiny-arith", dataset=str(path), steps=10, rollout="torch", trainer="torch",
                   grpo=GRPOConfig(prompts_per_step=8, samples_per_prompt=4, eval_every=5, eval_size=500))
    planned, _, _ = plan(spec, load_calibration())
    generate = next(c for c in planned if c.fn == "generate")
    answers = 10 * 8 * 4 + 3 * held_out  # rollouts, and three evaluations of the held-out set (not 500)
    assert generate.units == answers * spec.grpo.max_tokens
    bigger = tmp_path / "more.jsonl"
    bigger.write_text(path.read_text() + "".join(json.dumps({"prompt": f"{a}*3=", "answer": str(3 * a)}) + "\n"
                                                   for a in range(300)))
    more = dataclasses.replace(spec, dataset=str(bigger))
    assert next(c for c in plan(more, load_calibration())[0] if c.fn == "generate").units > generate.units
