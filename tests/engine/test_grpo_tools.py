"""GRPO on the tool-using task (``arith-tools``) in this process, over the session's worker group:
answers really call the calculator, multi-turn answers train, and neither the seed's metrics nor
anything else that is logged as a metric depends on how long the tool took."""

import pytest

from engine.client import Client, SpecError
from engine.rl import grpo
from engine.service.eventlog import EventLog, read_events
from engine.tasks.tools import ToolConfig

CONFIG = grpo.GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, lr=1e-3,
                         max_tokens=4, eval_every=1, eval_size=10)
NO_STALL = ToolConfig(latency_median_s=0.0)
SHORT_STALL = ToolConfig(latency_median_s=0.02, latency_p99_s=0.05)


@pytest.fixture
def run_tools(router, tmp_path, tiny_tools_model_dir):
    """``run_tools(job, tools, steps=2, model=...) -> events`` of an ``arith-tools`` run."""

    def run(job: str, tools: ToolConfig, steps: int = 2, model: str | None = None):
        path = tmp_path / f"{job}.jsonl"
        events = EventLog(path)
        grpo.train(Client(router, events), job=job, model=model or str(tiny_tools_model_dir), task="arith-tools",
                   steps=steps, seed=0, config=CONFIG, tools=tools)
        events.close()
        return read_events(path)

    return run


def _kind(events, kind: str) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == kind]


def test_answers_call_the_tool_and_train_the_same_whatever_it_costs(run_tools, job):
    quick = run_tools(f"{job}-quick", NO_STALL)
    slow = run_tools(f"{job}-slow", SHORT_STALL)
    metrics = _kind(quick, "metrics")
    print("arith-tools metrics:", metrics, "timings:", _kind(slow, "timings"))
    assert [m["step"] for m in metrics] == [1, 2]
    assert any(m["tool_calls"] > 0 for m in metrics), "the base model should call the calculator"
    for m in metrics:
        assert 0 <= m["tool_errors"] <= m["tool_calls"] <= NO_STALL.max_calls
        assert 0 <= m["eval_tool_calls"] <= NO_STALL.max_calls
        # a turn may be longer than max_tokens=4: the task's floor lets a whole call fit
        assert m["response_length"] >= 1
    assert any(m["response_length"] > CONFIG.max_tokens for m in metrics)
    assert any(m["groups_used"] > 0 and m["grad_norm"] > 0 for m in metrics), "multi-turn answers must train"
    # metrics depend on the seed only, never on the tool's latency; the wait shows in timings
    assert _kind(slow, "metrics") == metrics
    assert all(t["tool_stall"] == 0.0 for t in _kind(quick, "timings"))
    assert sum(t["tool_stall"] for t in _kind(slow, "timings")) > 0
    for t in _kind(slow, "timings"):
        assert t["generate"] + t["eval"] >= t["tool_stall"]  # the driver slept inside those phases


def test_a_model_without_the_tool_tokens_is_refused(run_tools, job, tiny_model_dir):
    with pytest.raises(SpecError, match=r"model: task 'arith-tools'.*no token for") as info:
        run_tools(job, NO_STALL, steps=1, model=str(tiny_model_dir))
    assert info.value.field == "model"
