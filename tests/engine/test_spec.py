"""The job spec validates itself and names the bad field (the platform maps it to a 400 field error)."""

import dataclasses

import pytest

from engine.errors import EngineError, SpecError
from engine.spec import GRPOConfig, JobSpec
from engine.tasks.tools import ToolConfig


def test_defaults_are_valid_and_round_trip():
    spec = JobSpec()
    assert spec.task == "arith"
    assert spec.algorithm == "grpo"
    assert JobSpec.from_dict(spec.to_dict()) == spec
    custom = JobSpec(steps=3, seed=5, model="/some/dir", grpo=GRPOConfig(prompts_per_step=16, kl_coef=0.1))
    assert JobSpec.from_dict(custom.to_dict()) == custom
    assert JobSpec.from_dict({}) == spec
    assert JobSpec.from_dict({"grpo": None}) == spec


def test_backends_default_to_vllm_and_megatron_when_installed(monkeypatch):
    import engine.spec as spec_module

    assert (JobSpec().rollout, JobSpec().trainer) == (
        "vllm" if spec_module._installed("vllm") else "torch",
        "megatron" if spec_module._installed("megatron.core") else "torch",
    )
    assert JobSpec().tp == 1
    monkeypatch.setattr(spec_module, "_installed", lambda module: False)
    assert (JobSpec().rollout, JobSpec().trainer) == ("torch", "torch")
    with pytest.raises(SpecError, match="backend 'vllm' is not installed") as info:
        JobSpec(rollout="vllm")
    assert info.value.field == "rollout"
    with pytest.raises(SpecError, match="backend 'megatron' is not installed") as info:
        JobSpec(trainer="megatron")
    assert info.value.field == "trainer"


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobSpec().steps = 3  # type: ignore[misc]


def test_spec_error_is_a_value_error_with_field_and_message():
    err = SpecError("steps", "must be positive")
    assert isinstance(err, ValueError)
    assert isinstance(err, EngineError)
    assert (err.field, err.message, str(err)) == ("steps", "must be positive", "steps: must be positive")


@pytest.mark.parametrize(
    ("kwargs", "field", "match"),
    [
        ({"task": "nope"}, "task", "unknown task 'nope'; known: arith"),
        ({"steps": 0}, "steps", "positive integer, got 0"),
        ({"steps": -1}, "steps", "positive integer, got -1"),
        ({"steps": 2.5}, "steps", "positive integer"),
        ({"steps": "5"}, "steps", "positive integer"),
        ({"seed": -1}, "seed", "non-negative integer"),
        ({"algorithm": "ppo"}, "algorithm", "unknown algorithm 'ppo'"),
        ({"model": ""}, "model", "required"),
        ({"rollout": "sglang"}, "rollout", "unknown backend 'sglang'; known: torch, vllm"),
        ({"trainer": "fsdp"}, "trainer", "unknown backend 'fsdp'; known: torch, megatron"),
        ({"tp": 0}, "tp", "integer from 1 to 8, got 0"),
        ({"tp": 2.0}, "tp", "integer from 1 to 8"),
        ({"tp": True}, "tp", "integer from 1 to 8"),
        ({"tp": 2, "trainer": "torch"}, "tp", "needs the megatron trainer, not 'torch'"),
        ({"task": "arith-tools", "model": "tiny-arith"}, "model", "never taught the calculator"),
        ({"tools": ToolConfig(latency_median_s=0.0)}, "tools", "task 'arith' calls no tool"),
        ({"task": "arith-tools", "tools": "fast"}, "tools", "must be a tool config"),
    ],
)
def test_bad_top_level_fields(kwargs, field, match):
    with pytest.raises(SpecError, match=match) as info:
        JobSpec(**kwargs)
    assert info.value.field == field
    # and the same through from_dict, the platform's way in
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(kwargs)
    assert info.value.field == field


def test_each_task_has_its_default_model():
    assert JobSpec().model == "tiny-arith"
    tools = JobSpec(task="arith-tools")
    assert (tools.model, tools.tools) == ("tiny-arith-tools", ToolConfig())
    assert JobSpec.from_dict({"task": "arith-tools", "model": None}) == tools
    assert JobSpec(task="arith-tools", model="/some/dir").model == "/some/dir"  # a folder is checked at start
    custom = JobSpec(task="arith-tools", tools=ToolConfig(latency_median_s=0.5, latency_p99_s=2, max_calls=1))
    assert JobSpec.from_dict(custom.to_dict()) == custom


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ({"latency_median_s": -1.0}, "tools.latency_median_s"),
        ({"latency_median_s": 2.0, "latency_p99_s": 1.0}, "tools.latency_p99_s"),
        ({"max_calls": 100}, "tools.max_calls"),
        ({"latency": 1.0}, "tools.latency"),
    ],
)
def test_bad_tool_fields_are_named_as_nested(tools, field):
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"task": "arith-tools", "tools": tools})
    assert info.value.field == field


def test_unknown_field_in_from_dict():
    with pytest.raises(SpecError, match="unknown field") as info:
        JobSpec.from_dict({"steps": 3, "stepz": 4, "aardvark": 1})
    assert info.value.field == "aardvark"  # the first unknown name, alphabetically


def test_unknown_grpo_field_in_from_dict():
    with pytest.raises(SpecError, match="unknown field") as info:
        JobSpec.from_dict({"grpo": {"lr": 1e-3, "learning_rate": 1e-3}})
    assert info.value.field == "grpo.learning_rate"


BAD_GRPO = [
    ("prompts_per_step", 0),
    ("samples_per_prompt", 1),
    ("samples_per_prompt", 0),
    ("updates_per_step", 0),
    ("max_tokens", 0),
    ("eval_every", 0),
    ("eval_size", -5),
    ("lr", 0.0),
    ("lr", -1e-3),
    ("clip_eps", 0.0),
    ("clip_eps", 1.0),
    ("kl_coef", -0.1),
    ("temperature", 0.0),
    ("checkpoint_every", -1),
    ("checkpoint_every", 1.5),
]


@pytest.mark.parametrize(("field", "value"), BAD_GRPO)
def test_bad_grpo_values(field, value):
    with pytest.raises(SpecError) as info:
        GRPOConfig(**{field: value})
    assert info.value.field == field
    # nested in a spec, the field is named the way the caller spelled it
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"grpo": {field: value}})
    assert info.value.field == f"grpo.{field}"


def test_good_grpo_edge_values():
    edge = {"samples_per_prompt": 2, "clip_eps": 0.01, "kl_coef": 0.0, "prompts_per_step": 1, "eval_every": 1,
            "eval_size": 1}
    grpo = GRPOConfig(**edge)
    assert {name: getattr(grpo, name) for name in edge} == edge  # kept as given, none clamped or replaced
    assert dataclasses.asdict(grpo) == dataclasses.asdict(GRPOConfig()) | edge  # the other fields: defaults
    spec = JobSpec(grpo=grpo)
    data = spec.to_dict()
    assert data["grpo"] == dataclasses.asdict(GRPOConfig()) | edge
    again = JobSpec.from_dict(data)
    assert again == spec
    assert again.grpo == grpo


def test_non_numeric_grpo_value_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"grpo": {"lr": "fast"}})
    assert info.value.field == "grpo.lr"
