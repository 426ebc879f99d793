"""The arithmetic task: a content-fixed train / held-out split, correct answers, seeded batches."""

import re

import pytest

from engine.tasks.arithmetic import ArithTask, Problem, eval_problems, is_held_out
from engine.tasks.registry import get_task

PROBLEM = re.compile(r"(\d+)([+-]\d+){1,2}=")


def _value(prompt: str) -> int:
    """The prompt's value computed by Python itself (after checking it is only digits, + and -)."""
    assert PROBLEM.fullmatch(prompt), prompt
    return eval(prompt[:-1], {"__builtins__": {}})  # noqa: S307 - matched against PROBLEM above


@pytest.fixture(scope="module")
def task() -> ArithTask:
    return get_task("arith")


@pytest.fixture(scope="module")
def train_problems(task) -> list[Problem]:
    """Four thousand training problems from several seeds and steps."""
    return [p for seed in (0, 1) for step in (1, 2) for p in task.train_batch(seed, step, 1000)]


def test_training_never_draws_held_out_problems(train_problems, task):
    assert len(train_problems) == 4000
    assert not any(is_held_out(p) for p in train_problems)
    eval_prompts = {p.prompt for p in task.eval_set(500)}
    assert not eval_prompts & {p.prompt for p in train_problems}


def test_the_split_is_not_trivial(train_problems):
    # both shapes and a wide range of problems reach training; one in ten prompts is held out
    prompts = {p.prompt for p in train_problems}
    assert len(prompts) > 2000
    assert any(p.count("+") + p.count("-") == 1 for p in prompts)
    assert any(p.count("+") + p.count("-") == 2 for p in prompts)


def test_held_out_depends_only_on_the_prompt():
    problems = eval_problems(100)
    assert all(is_held_out(p) for p in problems)
    assert all(is_held_out(Problem(prompt=p.prompt, answer="wrong")) for p in problems)


def test_eval_set_is_fixed_distinct_and_held_out(task):
    first, second = task.eval_set(500), get_task("arith").eval_set(500)
    assert first == second
    assert len(first) == 500
    assert len({p.prompt for p in first}) == 500
    assert all(is_held_out(p) for p in first)
    # a smaller evaluation is the start of a larger one, so accuracies at different sizes compare
    assert task.eval_set(50) == first[:50]


def test_answers_are_correct(train_problems, task):
    for p in train_problems[:2000] + task.eval_set(500):
        assert int(p.answer) == _value(p.prompt), p
        assert p.answer == str(int(p.answer))  # canonical: no "+", no leading zeros


def test_operand_ranges(train_problems):
    for p in train_problems:
        operands = [int(x) for x in re.findall(r"\d+", p.prompt)]
        assert all(x >= 0 for x in operands)
        assert max(operands) <= (99 if len(operands) == 2 else 49), p


def test_answers_can_be_negative(train_problems):
    assert any(int(p.answer) < 0 for p in train_problems)


def test_batches_are_seeded(task):
    batch = task.train_batch(7, 3, 64)
    assert batch == task.train_batch(7, 3, 64)
    assert batch == get_task("arith").train_batch(7, 3, 64)
    assert batch != task.train_batch(8, 3, 64)
    assert batch != task.train_batch(7, 4, 64)
    assert len(batch) == 64


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task 'nope'; known: arith, arith-tools"):
        get_task("nope")


def test_the_tool_task_has_the_same_problems_and_split():
    plain, tools = get_task("arith"), get_task("arith-tools")
    assert tools.uses_tools
    assert not plain.uses_tools
    assert tools.train_batch(3, 5, 200) == plain.train_batch(3, 5, 200)
    assert tools.eval_set(100) == plain.eval_set(100)
    # scored exactly: math-verify would take the problem's own expression and skip the calculator
    assert tools.reward("70", "70") == 1.0
    assert tools.reward("37+45-12", "70") == tools.reward("70]", "70") == 0.0
