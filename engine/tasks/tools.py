"""The calculator tool: a safe arithmetic evaluator, its seeded latency, and the multi-turn rollout.

A policy calls the tool by writing ``[<expression>]``: the sample stops at ``]`` (a stop token),
the environment evaluates the expression, waits the tool's latency and appends the result, and
generation goes on from everything so far. While it waits, the driver only sleeps: the rollout
worker group is idle, and that gap is what other jobs' calls fill.

The calculator never evaluates model text as Python: :func:`calculate` is a small recursive-descent
parser for non-negative integer literals, ``+ - *``, unary minus and parentheses, with limits on
length, literal size, nesting and result size; anything else is a :class:`ToolError`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from engine.api import Completion, SamplingParams
from engine.errors import SpecError
from engine.fields import declared

# -- the calculator ------------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 64
MAX_LITERAL_DIGITS = 9
MAX_DEPTH = 8  # nested parentheses and unary minus signs
MAX_RESULT = 10**18  # results beyond this are refused: a few "*" of big literals would grow without bound

_SPACE = " \t"
_TOKEN = re.compile(r"[0-9]+|[-+*()]")  # ASCII digits only: int() would also take other scripts' digits

class ToolError(ValueError):
    """An expression the calculator refuses (the model is shown the error marker instead)."""


def _lex(expression: str) -> list[str]:
    tokens, pos = [], 0
    while True:
        while pos < len(expression) and expression[pos] in _SPACE:
            pos += 1
        if pos == len(expression):
            return tokens
        m = _TOKEN.match(expression, pos)
        if m is None:
            raise ToolError(f"unexpected character {expression[pos]!r} at {pos}")
        symbol = m.group()
        if len(symbol) > MAX_LITERAL_DIGITS:  # only literals are longer than one character
            raise ToolError(f"literal {symbol[:12]}... longer than {MAX_LITERAL_DIGITS} digits")
        tokens.append(symbol)
        pos = m.end()


class _Parser:
    """expr := term (("+" | "-") term)* ; term := factor ("*" factor)* ;
    factor := NUMBER | "-" factor | "(" expr ")" """

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        symbol = self.peek()
        if symbol is None:
            raise ToolError("unexpected end of expression")
        self.pos += 1
        return symbol

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _bounded(value + self.term() if op == "+" else value - self.term())
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.take()
            value = _bounded(value * self.factor())
        return value

    def factor(self) -> int:
        symbol = self.take()
        if symbol[0] in "0123456789":  # the lexer's literals are ASCII digits only
            return int(symbol)
        if symbol not in ("-", "("):
            raise ToolError(f"unexpected {symbol!r}")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ToolError(f"nested deeper than {MAX_DEPTH}")
        if symbol == "-":
            value = -self.factor()
        else:
            value = self.expr()
            if self.take() != ")":
                raise ToolError("expected ')'")
        self.depth -= 1
        return value


def _bounded(value: int) -> int:
    if abs(value) > MAX_RESULT:
        raise ToolError("result too large")
    return value


def calculate(expression: str) -> int:
    """The integer value of ``expression`` (``ToolError`` for anything outside the grammar)."""
    if not isinstance(expression, str):
        raise ToolError("the expression must be text")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _lex(expression)
    if not tokens:
        raise ToolError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ToolError(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return value


# -- latency and configuration -------------------------------------------------------------------

Z99 = NormalDist().inv_cdf(0.99)  # 2.326...
MAX_CALLS = 8  # each call adds a turn and its result to the context, and small models have few positions


@dataclass(frozen=True)
class ToolLatency:
    """Log-normal call latency given by its median and 99th percentile (seconds): mu = ln(median),
    sigma = ln(p99 / median) / z(0.99). A median of 0 means no stall (tests, and runs that want the
    task without the waiting)."""

    median_s: float = 1.0
    p99_s: float = 5.0

    def __post_init__(self):
        for name in ("median_s", "p99_s"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise SpecError(name, f"must be a finite number of seconds >= 0 (0: no stall), got {value!r}")
        if self.median_s > 0 and self.p99_s < self.median_s:
            raise SpecError("p99_s", f"must be >= the median ({self.median_s}), got {self.p99_s}")

    @property
    def mu(self) -> float:
        return math.log(self.median_s)

    @property
    def sigma(self) -> float:
        return math.log(self.p99_s / self.median_s) / Z99

    def draw(self, n: int, key: Sequence[int]) -> np.ndarray:
        """``n`` latencies from a generator seeded by ``key`` (run seed, step, turn, ...): the same
        key gives the same latencies in every process."""
        if self.median_s == 0:
            return np.zeros(n)
        return np.random.default_rng(list(key)).lognormal(self.mu, self.sigma, size=n)


@dataclass(frozen=True)
class ToolConfig:
    """How a tool-using task's calculator behaves: its latency and the calls an answer may make."""

    latency_median_s: float = declared(1.0, doc="The calculator's median latency in seconds (0: no stall).",
                                       label="Median latency (s)", minimum=0)
    latency_p99_s: float = declared(5.0, doc="Its 99th-percentile latency in seconds (at least the median).",
                                    label="p99 latency (s)", minimum=0)
    max_calls: int = declared(2, doc="Calculator calls an answer may make.", label="Calls per answer", minimum=0,
                              maximum=MAX_CALLS)  # a "]" after the last one is plain text

    def __post_init__(self):
        try:
            self.latency  # noqa: B018 - validates the latency fields
        except SpecError as exc:
            raise SpecError(f"latency_{exc.field}", exc.message) from None
        if type(self.max_calls) is not int or not 0 <= self.max_calls <= MAX_CALLS:
            raise SpecError("max_calls", f"must be an integer from 0 to {MAX_CALLS}, got {self.max_calls!r}")

    @property
    def latency(self) -> ToolLatency:
        return ToolLatency(self.latency_median_s, self.latency_p99_s)


# -- the protocol --------------------------------------------------------------------------------

CALL_OPEN, CALL_CLOSE, ERROR_MARKER = "[", "]", "?"


@dataclass(frozen=True)
class ToolProtocol:
    """The tokenizer's view of the call syntax: which token closes a call, and how results read."""

    close_id: int
    encode: Callable[[str], list[int]]  # a result's text -> the token ids appended to the context

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ToolProtocol:
        """Raises ``ValueError`` when the tokenizer cannot write calls and results (a model that was
        never taught the tool, e.g. ``tiny-arith`` instead of ``tiny-arith-tools``)."""
        vocab = tokenizer.get_vocab()
        missing = [c for c in (CALL_OPEN, CALL_CLOSE, ERROR_MARKER, *"0123456789-") if c not in vocab]
        if missing:
            raise ValueError(f"the model's tokenizer has no token for {' '.join(missing)}: it cannot call the "
                             "calculator (use a model taught the tool, e.g. the tiny-arith-tools preset)")
        return cls(close_id=vocab[CALL_CLOSE], encode=lambda text: tokenizer.encode(text, add_special_tokens=False))


@dataclass(frozen=True)
class ToolCall:
    expression: str  # the text between "[" and "]"
    result: str  # the value's digits, or ERROR_MARKER when the calculator refused the expression
    result_tokens: list[int]  # what the environment appended to the context
    latency_s: float

    @property
    def ok(self) -> bool:
        return self.result != ERROR_MARKER


@dataclass(frozen=True)
class Turn:
    """One generate call's share of a trajectory: the model wrote ``tokens`` after ``context``."""

    context: list[int]  # the prompt, earlier turns and tool results: never trained on
    tokens: list[int]  # model-written: the only tokens a training row's completion holds
    logprobs: list[float]
    text: str
    call: ToolCall | None = None  # the call this turn ended with


@dataclass(frozen=True)
class Trajectory:
    """One sampled answer: its turns, the full text after the prompt, and the part that is scored."""

    prompt_index: int
    turns: list[Turn]
    text: str  # model text and tool results, as the model saw them
    answer: str  # the text with each call and any error marker removed (see answer_of)

    @property
    def calls(self) -> list[ToolCall]:
        return [t.call for t in self.turns if t.call is not None]

    @property
    def tokens_written(self) -> int:
        return sum(len(t.tokens) for t in self.turns)


@dataclass(frozen=True)
class Rollout:
    trajectories: list[Trajectory]  # prompt-major, as generate returns completions
    stall_s: float = 0.0  # seconds waited on the tool (one wait per turn: a turn's calls run at once)
    turns: int = 1  # generate calls made


def answer_of(turns: Sequence[Turn]) -> str:
    """The scored answer: each turn's text with the call it ended with cut out (from its last "[",
    or the whole turn when it has none), then that call's result unless it failed.

    So ``[37+45-12]``, result ``70``, then EOS answers ``70``, as does ``70`` + EOS without a call;
    a model that repeats the result after it (``[37+45-12]``, ``70``, then ``70`` + EOS) answers
    ``7070``, wrong. Text before a call stays: ``5[3+4]``, ``7``, EOS answers ``57``.
    """
    parts = []
    for turn in turns:
        if turn.call is None:
            parts.append(turn.text)
            continue
        cut = turn.text.rfind(CALL_OPEN)
        parts.append(turn.text[:cut] if cut >= 0 else "")
        if turn.call.ok:
            parts.append(turn.call.result)
    return "".join(parts)


def _call_expression(text: str) -> str:
    """The expression of a turn that stopped at "]": after its last "[" (a turn without one
    makes a malformed call, answered with the error marker)."""
    body = text[:-1] if text.endswith(CALL_CLOSE) else text
    cut = body.rfind(CALL_OPEN)
    return body[cut + 1 :] if cut >= 0 else CALL_OPEN  # "[" alone never parses


def _run_call(expression: str, protocol: ToolProtocol, latency_s: float) -> ToolCall:
    try:
        result = str(calculate(expression))
    except ToolError:
        result = ERROR_MARKER
    return ToolCall(expression, result, protocol.encode(result), float(latency_s))


def turn_seed(seed: int, turn: int) -> int:
    """Turn 0 samples with the call's own seed (so a task without calls samples exactly as a single
    generate call would); later turns with seeds derived from it."""
    return seed if turn == 0 else int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


Generate = Callable[[list[list[int]], SamplingParams], list[Completion]]


def rollout(
    generate: Generate,
    prompts: list[list[int]],
    sampling: SamplingParams,
    *,
    protocol: ToolProtocol | None,
    config: ToolConfig | None = None,
    latency_key: Sequence[int] = (0,),
    sleep: Callable[[float], None] = time.sleep,
) -> Rollout:
    """Sample ``sampling.n`` answers per prompt, running the calculator for each call.

    Without a ``protocol`` this is one ``generate`` call (each trajectory one turn). With one, each
    turn samples every trajectory still going (``n`` per prompt in turn 0, then one per context);
    a sample that stops at "]" while calls are left gets its result appended and goes on in the
    next turn. All of a turn's calls run at once: the turn waits the longest of their latencies,
    drawn from ``(*latency_key, turn)``. ``generate`` and ``sleep`` are injected so the protocol
    runs on scripted completions in tests.
    """
    config = config or ToolConfig()
    calls_allowed = config.max_calls if protocol is not None else 0

    def params(turn: int) -> SamplingParams:
        stops = (protocol.close_id,) if turn < calls_allowed else ()
        if turn == 0:
            return dataclasses.replace(sampling, stop_token_ids=stops)
        return dataclasses.replace(sampling, n=1, seed=turn_seed(sampling.seed, turn), stop_token_ids=stops)

    first = generate(prompts, params(0))
    turns: list[list[Turn]] = [[] for _ in first]
    contexts = [list(prompts[c.prompt_index]) for c in first]
    live, out, stall, turn = list(range(len(first))), first, 0.0, 0
    while True:
        calling = []  # trajectories whose turn ended on a call: they go on
        for i, c in zip(live, out, strict=True):
            turns[i].append(Turn(contexts[i], list(c.token_ids), list(c.logprobs), c.text))
            if turn < calls_allowed and c.token_ids and c.token_ids[-1] == protocol.close_id:
                calling.append(i)
        if not calling:
            break
        latencies = config.latency.draw(len(calling), [*latency_key, turn])
        for i, latency in zip(calling, latencies, strict=True):
            t = turns[i][-1]
            call = _run_call(_call_expression(t.text), protocol, latency)
            turns[i][-1] = dataclasses.replace(t, call=call)
            contexts[i] = t.context + t.tokens + call.result_tokens
        wait = float(latencies.max())
        if wait > 0:
            sleep(wait)  # the calls run; meanwhile the rollout group is free for other jobs
        stall += wait
        turn += 1
        live = calling
        out = generate([contexts[i] for i in live], params(turn))
    trajectories = []
    for c, ts in zip(first, turns, strict=True):
        text = "".join(t.text + (t.call.result if t.call else "") for t in ts)
        trajectories.append(Trajectory(c.prompt_index, ts, text, answer_of(ts)))
    return Rollout(trajectories, stall, turn + 1)


def training_rows(rollout: Rollout, trajectories: Sequence[int]) -> tuple[list[int], list[Turn]]:
    """The rows a batch trains on for the chosen trajectories: one per turn, ``(owner, turn)``,
    so every row's completion is model-written and environment tokens are only ever context."""
    owners, turns = [], []
    for i in trajectories:
        for t in rollout.trajectories[i].turns:
            owners.append(i)
            turns.append(t)
    return owners, turns
