"""The verifiable reward: exact match first, then math-verify equivalence."""

import pytest

from engine.tasks.rewards import is_well_formed_number, math_reward


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("-7", "-7"),
        (" -7\n", "-7"),  # surrounding whitespace is not part of the answer
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("$\\frac{1}{2}$", "0.5"),
        ("1/2", "0.5"),
        ("1,000", "1000"),
        ("1000", "1,000"),
        ("7.0", "7"),
        ("\\boxed{42}", "42"),
    ],
)
def test_equivalent_answers_are_right(response, answer):
    assert math_reward(response, answer) == 1.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("12", "13"),
        ("13", "12"),
        ("-7", "7"),
        ("7", "-7"),
        ("4 2", "42"),
        ("abc", "12"),
        ("", "12"),
        ("   ", "0"),
        ("+-=", "0"),
        ("=", "0"),
        ("0", ""),
    ],
)
def test_wrong_or_garbage_answers_are_wrong(response, answer):
    assert math_reward(response, answer) == 0.0


def test_reward_is_a_float_in_zero_one():
    for response in ("5", "6", "x"):
        value = math_reward(response, "5")
        assert isinstance(value, float)
        assert value in (0.0, 1.0)


@pytest.mark.parametrize(("text", "expected"), [
    ("12", True),
    ("-7", True),
    ("0", True),
    (" 5\n", True),
    ("007", True),
    ("+5", False),
    ("1.0", False),
    ("1,000", False),
    ("--1", False),
    ("1 2", False),
    ("12=", False),
    ("", False),
    ("abc", False),
])
def test_is_well_formed_number(text, expected):
    assert is_well_formed_number(text) is expected
