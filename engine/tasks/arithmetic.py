"""Arithmetic problems generated locally, with a train / held-out split fixed by content.

A problem belongs to the held-out split when a SHA-256 of its text falls in a fixed bucket, so the
split is the same in every process and for every run seed, and training can never draw a held-out
problem. Run seeds only choose which training problems a step sees.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from engine.tasks.rewards import exact_reward

# Every problem is "<a><op><b>[<op><c>]=" with non-negative operands; answers may be negative.
OPERATORS = ("+", "-")
TWO_OPERAND_MAX = 99
THREE_OPERAND_MAX = 49
HELD_OUT_BUCKETS = 10  # one bucket in ten is held out
EVAL_SEED = 20261129  # the evaluation sample is the same for every run seed


@dataclass(frozen=True)
class Problem:
    prompt: str  # e.g. "37+45-12="
    answer: str  # e.g. "70"


def _make(operands: list[int], ops: list[str]) -> Problem:
    expr = str(operands[0])
    value = operands[0]
    for op, x in zip(ops, operands[1:], strict=True):
        expr += f"{op}{x}"
        value = value + x if op == "+" else value - x
    return Problem(prompt=f"{expr}=", answer=str(value))


def is_held_out(problem: Problem) -> bool:
    digest = hashlib.sha256(problem.prompt.encode()).digest()
    return digest[0] % HELD_OUT_BUCKETS == 0


def _draw(rng: np.random.Generator) -> Problem:
    if rng.random() < 0.5:
        operands = rng.integers(0, TWO_OPERAND_MAX + 1, size=2).tolist()
        ops = [OPERATORS[i] for i in rng.integers(0, 2, size=1).tolist()]
    else:
        operands = rng.integers(0, THREE_OPERAND_MAX + 1, size=3).tolist()
        ops = [OPERATORS[i] for i in rng.integers(0, 2, size=2).tolist()]
    return _make(operands, ops)


def sample_problems(rng: np.random.Generator, n: int, *, held_out: bool = False) -> list[Problem]:
    """Draw ``n`` problems (with repetition) from one split, by rejection on the split bucket."""
    out: list[Problem] = []
    while len(out) < n:
        p = _draw(rng)
        if is_held_out(p) == held_out:
            out.append(p)
    return out


def eval_problems(n: int) -> list[Problem]:
    """``n`` distinct held-out problems, identical for every run (the evaluation set)."""
    rng = np.random.default_rng(EVAL_SEED)
    seen: dict[str, Problem] = {}
    while len(seen) < n:
        for p in sample_problems(rng, n, held_out=True):
            seen.setdefault(p.prompt, p)
            if len(seen) == n:
                break
    return list(seen.values())


class ArithTask:
    """The ``arith`` task: two- and three-operand integer addition and subtraction."""

    name = "arith"
    default_model = "tiny-arith"  # the preset a job of this task trains unless it names a model
    uses_tools = False
    min_turn_tokens = 1  # the least max_tokens one generate call needs (see ArithToolsTask)
    reward = None  # (response, gold) -> float; None: the default verifier, rewards.math_reward

    def train_batch(self, seed: int, step: int, n: int) -> list[Problem]:
        rng = np.random.default_rng([seed, step])
        return sample_problems(rng, n, held_out=False)

    def eval_set(self, n: int) -> list[Problem]:
        return eval_problems(n)


class ArithToolsTask(ArithTask):
    """``arith-tools``: the same problems and split, and a calculator the policy may call mid-answer
    by writing ``[<expression>]`` (engine/tasks/tools.py has the protocol and the scoring rule). Each
    call stalls the rollout for the tool's latency: idle time on the rollout group."""

    name = "arith-tools"
    default_model = "tiny-arith-tools"
    uses_tools = True
    # A turn must hold the longest call, "[49+49-49]": fewer tokens would cut every such call short.
    min_turn_tokens = 12
    # Exact match: math-verify would also take the problem's own expression, a way around the tool.
    reward = staticmethod(exact_reward)
