"""A user's JSONL problems: validation that names the line, a fixed split, and a GRPO run on them."""

from __future__ import annotations

import json

import pytest

from engine.client import Client
from engine.errors import SpecError
from engine.rl import grpo
from engine.service.eventlog import EventLog, read_events
from engine.spec import JobSpec
from engine.tasks.arithmetic import Problem, sample_problems
from engine.tasks.datasets import DatasetError, DatasetTask, held_out, parse_problems, split


def lines(*rows) -> list[str]:
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


def test_valid_lines_parse_and_blank_lines_are_skipped():
    problems = parse_problems(lines({"prompt": "1+1=", "answer": "2"}, "", {"prompt": "half of 1", "answer": 0.5}))
    assert problems == [Problem("1+1=", "2"), Problem("half of 1", "0.5")]


@pytest.mark.parametrize(("rows", "message"), [
    (lines({"prompt": "a", "answer": "1"}, "{not json"), "line 2: not JSON"),
    (lines({"prompt": "a"}), 'line 1: "answer" must be a non-empty string'),
    (lines({"prompt": " ", "answer": "1"}), 'line 1: "prompt" must be a non-empty string'),
    (lines({"prompt": "a", "answer": "1", "hint": "x"}), "line 1: unknown field 'hint'"),
    (lines([1, 2]), "line 1: expected an object"),
    (lines({"prompt": "a", "answer": "1"}, {"prompt": "a", "answer": "2"}), "line 2: the prompt appears twice"),
    ([b"\xff\xfe"], "line 1: not UTF-8"),
    (["", "  "], "no problems"),
])
def test_bad_lines_are_named(rows, message):
    with pytest.raises(DatasetError, match=message):
        parse_problems(rows)


def test_the_split_is_fixed_by_content_and_disjoint():
    problems = [Problem(f"q{i}", str(i)) for i in range(200)]
    train, test = split(problems)
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in test})
    assert len(train) + len(test) == 200
    assert all(held_out(p) for p in test)
    assert split(list(reversed(problems)))[1] == list(reversed(test))  # membership by content, not order
    tiny_train, tiny_test = split([Problem("a", "1"), Problem("b", "2")])
    assert len(tiny_test) == 1  # something is always held out
    assert len(tiny_train) == 1


def test_the_spec_needs_a_dataset_and_a_model_for_the_dataset_task():
    with pytest.raises(SpecError, match="dataset"):
        JobSpec(task="dataset", model="tiny-arith")
    with pytest.raises(SpecError, match="model"):
        JobSpec(task="dataset", dataset="/x.jsonl")
    with pytest.raises(SpecError, match="only task 'dataset'"):
        JobSpec(task="arith", dataset="/x.jsonl")
    assert JobSpec(task="dataset", model="tiny-arith", dataset="/x.jsonl").dataset == "/x.jsonl"


@pytest.fixture
def arith_jsonl(tmp_path):
    import numpy as np

    path = tmp_path / "problems.jsonl"
    problems = {p.prompt: p for p in sample_problems(np.random.default_rng(0), 400)}
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems.values()))
    return path


def test_train_batches_are_seeded_and_drawn_from_the_train_split(arith_jsonl):
    task = DatasetTask(arith_jsonl)
    batch = task.train_batch(0, 1, 16)
    assert batch == DatasetTask(arith_jsonl).train_batch(0, 1, 16)
    assert batch != task.train_batch(0, 2, 16)
    assert not any(held_out(p) for p in batch)
    assert task.eval_set(5) == task.test[:5]


def test_grpo_trains_on_a_dataset_with_the_math_verify_reward(router, job, tiny_model_dir, arith_jsonl, tmp_path):
    path = tmp_path / "events.jsonl"
    events = EventLog(path)
    config = grpo.GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, max_tokens=4,
                             eval_every=1, eval_size=10)
    summary = grpo.train(Client(router, events), job=job, model="tiny-arith", task="dataset", steps=2, seed=0,
                         config=config, dataset=str(arith_jsonl))
    events.close()
    metrics = [e["data"] for e in read_events(path) if e["kind"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("eval_accuracy" in m for m in metrics)
    assert summary["steps"] == 2
