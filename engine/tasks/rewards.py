"""Verifiable rewards: exact match first, then ``math-verify`` equivalence.

The reward is a pure function of (response text, gold answer), so results are memoised: a step
of thousands of samples on a small answer space repeats the same pairs many times.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

from math_verify import parse, verify

_NUMBER = re.compile(r"-?\d+")
# math-verify warns on every call that timeouts are off; we turn them off on purpose (see _parse).
logging.getLogger("math_verify").setLevel(logging.ERROR)


@lru_cache(maxsize=1 << 16)
def _parse(text: str):
    # Timeouts off: they use SIGALRM, which only works on a main thread (not in every Ray actor);
    # our inputs are a few characters long, capped by max_tokens.
    return parse(text, parsing_timeout=None)


@lru_cache(maxsize=1 << 18)
def math_reward(response: str, answer: str) -> float:
    """1.0 when ``response`` states ``answer`` (exactly, or equivalently per math-verify), else 0.0."""
    response = response.strip()
    if response == answer.strip():
        return 1.0
    gold, pred = _parse(answer), _parse(response)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def exact_reward(response: str, answer: str) -> float:
    """1.0 when ``response`` is the gold answer's very text (spaces aside), else 0.0.

    For tasks where math-verify's leniency is a loophole: it accepts an unevaluated expression
    ("37+45-12" for 70) and trailing junk ("70]"), so a policy with a calculator could skip it by
    copying the problem."""
    return 1.0 if response.strip() == answer.strip() else 0.0


def is_well_formed_number(response: str) -> bool:
    """A response that is one integer and nothing else (used to judge the base model's format)."""
    return _NUMBER.fullmatch(response.strip()) is not None


def score_answers(responses: list[str], answers: list[str], reward=None) -> dict[str, float]:
    """Accuracy (by ``reward``, default ``math_reward``) and the fraction of well-formed answers
    over a set of (response, gold) pairs."""
    reward = reward or math_reward
    return {
        "accuracy": float(sum(reward(r, a) for r, a in zip(responses, answers, strict=True)) / len(answers)),
        "well_formed": float(sum(is_well_formed_number(r) for r in responses) / len(responses)),
    }
