"""The calculator tool: a parser that evaluates arithmetic and nothing else, a seeded log-normal
latency, and the multi-turn protocol on scripted completions (no model, no Ray)."""

from __future__ import annotations

import builtins
import dataclasses

import numpy as np
import pytest

from engine.api import Completion, SamplingParams
from engine.errors import SpecError
from engine.models.tiny import train_tokenizer
from engine.tasks.arithmetic import ArithToolsTask, eval_problems
from engine.tasks.tools import (
    ERROR_MARKER,
    ToolConfig,
    ToolError,
    ToolLatency,
    ToolProtocol,
    answer_of,
    calculate,
    rollout,
    training_rows,
    turn_seed,
)

# --- the calculator -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("37+45-12", 70),
        ("7", 7),
        ("2+3*4", 14),  # * binds tighter
        ("(2+3)*4", 20),
        ("10-3-2", 5),  # left-associative
        ("2*(3-(4-5))", 8),
        ("-5+2", -3),
        ("2*-3", -6),
        ("--4", 4),
        (" 1 + 2 ", 3),
        ("007", 7),
        ("999999999*999999999", 999999998000000001),
    ],
)
def test_calculates(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("abc", "unexpected character 'a'"),
        ("__import__('os').system('true')", "unexpected character '_'"),
        ("1_000", "unexpected character '_'"),
        ("print(1)", "unexpected character 'p'"),
        ("os.getcwd()", "unexpected character 'o'"),
        ("1.5", "unexpected character '.'"),
        ("1e5", "unexpected character 'e'"),
        ("0x10", "unexpected character 'x'"),
        ("2**3", "unexpected '\\*'"),
        ("1/2", "unexpected character '/'"),
        ("1+", "unexpected end"),
        ("(1+2", "unexpected end"),
        ("1+2)", "after a complete expression"),
        ("1 2", "after a complete expression"),
        (" 1 + x", "unexpected character 'x' at 5"),
        ("\u0663+1", "unexpected character"),  # an Arabic-Indic 3: int() would take it, the calculator not
        ("1\n+1", "unexpected character .* at 1"),  # spaces and tabs only
        ("()", "unexpected '\\)'"),
        ("1234567890", "longer than 9 digits"),
        ("(" * 9 + "1" + ")" * 9, "nested deeper than 8"),
        ("-" * 9 + "1", "nested deeper than 8"),
        ("1" + "+1" * 40, "longer than 64 characters"),
        ("999999999*999999999*999999999", "result too large"),
    ],
)
def test_refuses_everything_else(expression, why):
    with pytest.raises(ToolError, match=why):
        calculate(expression)


def test_never_evaluates_python(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the calculator must not run Python on model text")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden)
    assert calculate("(1+2)*3-4") == 5
    with pytest.raises(ToolError):
        calculate("__import__('os')")


def test_agrees_with_python_on_random_expressions():
    rng = np.random.default_rng(0)

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.3:
            return str(rng.integers(0, 1000))
        kind = rng.integers(0, 3)
        if kind == 0:
            return f"({expr(depth - 1)})"
        if kind == 1:
            return f"-{expr(depth - 1)}"
        return f"{expr(depth - 1)}{rng.choice(['+', '-', '*'])}{expr(depth - 1)}"

    checked = 0
    for _ in range(500):
        e = expr(3)
        if len(e) > 64:
            continue
        assert set(e) <= set("0123456789+-*()"), e
        assert calculate(e) == eval(e, {"__builtins__": {}}), e  # noqa: S307 - checked against the grammar above
        checked += 1
    assert checked > 300


# --- latency ------------------------------------------------------------------------------------


def test_latency_has_the_asked_median_and_p99():
    draws = ToolLatency(median_s=1.0, p99_s=5.0).draw(200_000, (0, 1, 2))
    assert np.median(draws) == pytest.approx(1.0, rel=0.02)
    assert np.quantile(draws, 0.99) == pytest.approx(5.0, rel=0.05)
    assert (draws > 0).all()
    other = ToolLatency(median_s=0.2, p99_s=0.3).draw(200_000, (0,))
    assert np.median(other) == pytest.approx(0.2, rel=0.02)
    assert np.quantile(other, 0.99) == pytest.approx(0.3, rel=0.05)


def test_latency_is_seeded_by_its_key():
    latency = ToolLatency()
    assert (latency.draw(8, (3, 1, 0)) == latency.draw(8, (3, 1, 0))).all()
    assert not (latency.draw(8, (3, 1, 0)) == latency.draw(8, (3, 1, 1))).any()  # another turn
    assert not (latency.draw(8, (3, 1, 0)) == latency.draw(8, (3, 2, 0))).any()  # another step


def test_zero_median_means_no_stall():
    assert (ToolLatency(median_s=0.0).draw(5, (0,)) == 0).all()
    assert (ToolConfig(latency_median_s=0, latency_p99_s=0).latency.draw(3, (1,)) == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "field", "match"),
    [
        ({"latency_median_s": -1.0}, "latency_median_s", ">= 0"),
        ({"latency_median_s": float("nan")}, "latency_median_s", "finite"),
        ({"latency_p99_s": float("inf")}, "latency_p99_s", "finite"),
        ({"latency_median_s": "1"}, "latency_median_s", "number"),
        ({"latency_p99_s": 0.5}, "latency_p99_s", "must be >= the median"),
        ({"max_calls": -1}, "max_calls", "from 0 to 8"),
        ({"max_calls": 9}, "max_calls", "from 0 to 8"),
        ({"max_calls": 1.0}, "max_calls", "from 0 to 8"),
    ],
)
def test_bad_tool_configs_name_the_field(kwargs, field, match):
    with pytest.raises(SpecError, match=match) as info:
        ToolConfig(**kwargs)
    assert info.value.field == field


# --- the protocol, on scripted completions -------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    """A character tokenizer with the tool's tokens, as the tiny-arith-tools preset trains one."""
    return train_tokenizer(eval_problems(50), extra="[]?")


class Scripted:
    """A stand-in for ``policy.generate``: for each context (as text) a script of what the model
    would write (one string, or one per sample), honouring stop tokens, EOS and max_tokens.
    Each token's log-prob is -(its position + 1) / 100 within the call, to check rows by."""

    def __init__(self, tok, script: dict[str, str | list[str]]):
        self.tok, self.script, self.calls = tok, script, []

    def __call__(self, prompts, sampling: SamplingParams) -> list[Completion]:
        self.calls.append((prompts, sampling))
        out = []
        stops = {self.tok.eos_token_id, *sampling.stop_token_ids}
        for i, prompt in enumerate(prompts):
            context = self.tok.decode(prompt, skip_special_tokens=True)
            for j in range(sampling.n):
                written = self.script[context]
                written = written[j] if isinstance(written, list) else written
                ids = self.tok.encode(written.replace("<eos>", ""), add_special_tokens=False)
                ids += [self.tok.eos_token_id] if written.endswith("<eos>") else []
                cut = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
                ids = ids[: min(cut, sampling.max_tokens)]
                out.append(Completion(i, ids, self.tok.decode(ids, skip_special_tokens=True),
                                      [-(k + 1) / 100 for k in range(len(ids))]))
        return out


NO_STALL = ToolConfig(latency_median_s=0.0)
SAMPLING = SamplingParams(n=1, temperature=1.0, max_tokens=12, seed=42)


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_a_call_stops_generation_and_its_result_is_appended(tok):
    gen = Scripted(tok, {"37+45-12=": "[37+45-12]70<eos>", "37+45-12=[37+45-12]70": "<eos>"})
    out = rollout(gen, [_ids(tok, "37+45-12=")], SAMPLING, protocol=ToolProtocol.for_tokenizer(tok), config=NO_STALL)
    (traj,) = out.trajectories
    first, second = traj.turns
    assert first.text == "[37+45-12]"  # stopped at "]": the model did not get to write "70"
    assert first.call.expression == "37+45-12"
    assert first.call.result == "70"
    assert first.call.result_tokens == _ids(tok, "70")
    assert second.context == _ids(tok, "37+45-12=[37+45-12]70")  # generation goes on after the result
    assert second.tokens == [tok.eos_token_id]
    assert (traj.text, traj.answer, len(traj.calls), traj.tokens_written) == ("[37+45-12]70", "70", 1, 11)
    assert ArithToolsTask.reward(traj.answer, "70") == 1.0
    assert (out.turns, out.stall_s) == (2, 0.0)
    # turn 0 samples with the call's seed and may stop at "]"; turn 1 has a seed of its own
    (_, s0), (_, s1) = gen.calls
    close = tok.convert_tokens_to_ids("]")
    assert (s0.seed, s0.stop_token_ids) == (42, (close,))
    assert (s1.n, s1.seed, s1.stop_token_ids) == (1, turn_seed(42, 1), (close,))
    assert turn_seed(42, 1) not in (42, turn_seed(42, 2))


def test_training_rows_hold_only_model_written_tokens(tok):
    gen = Scripted(tok, {
        "12+7=": ["[12+7]<eos>", "19<eos>", "[1+]1<eos>"],
        "12+7=[12+7]19": "<eos>",
        "12+7=[1+]?": "20<eos>",
    })
    out = rollout(gen, [_ids(tok, "12+7=")], dataclasses.replace(SAMPLING, n=3),
                  protocol=ToolProtocol.for_tokenizer(tok), config=NO_STALL)
    assert [t.answer for t in out.trajectories] == ["19", "19", "20"]
    assert [len(t.turns) for t in out.trajectories] == [2, 1, 2]
    bad = out.trajectories[2].calls[0]
    assert (bad.expression, bad.result, bad.ok) == ("1+", ERROR_MARKER, False)
    assert out.trajectories[2].text == "[1+]?20"

    owners, turns = training_rows(out, [0, 1, 2])
    assert owners == [0, 0, 1, 2, 2]
    inserted = [_ids(tok, "19"), _ids(tok, "?")]
    for turn in turns:
        assert len(turn.logprobs) == len(turn.tokens)
        assert turn.logprobs == [-(k + 1) / 100 for k in range(len(turn.tokens))]  # each row its own call's
    rows = [(tok.decode(t.context), tok.decode(t.tokens)) for t in turns]
    assert rows == [
        ("12+7=", "[12+7]"), ("12+7=[12+7]19", "<eos>"),
        ("12+7=", "19<eos>"),
        ("12+7=", "[1+]"), ("12+7=[1+]?", "20<eos>"),
    ]
    # the environment's tokens are context only: no completion row holds a result
    assert turns[1].tokens == [tok.eos_token_id]
    assert turns[1].context[-2:] == inserted[0]
    assert turns[4].context[-1:] == inserted[1]
    assert training_rows(out, [1]) == ([1], [out.trajectories[1].turns[0]])


def test_calls_beyond_the_limit_are_plain_text(tok):
    gen = Scripted(tok, {"5+5=": "[5+5]", "5+5=[5+5]10": "[10+0]1<eos>"})
    out = rollout(gen, [_ids(tok, "5+5=")], SAMPLING, protocol=ToolProtocol.for_tokenizer(tok),
                  config=dataclasses.replace(NO_STALL, max_calls=1))
    (traj,) = out.trajectories
    assert len(traj.calls) == 1
    assert traj.turns[1].text == "[10+0]1"  # not stopped at its "]": no calls were left
    assert gen.calls[1][1].stop_token_ids == ()
    assert traj.answer == "10[10+0]1"
    assert ArithToolsTask.reward(traj.answer, "10") == 0.0


def test_answers_without_a_call_and_cut_calls(tok):
    gen = Scripted(tok, {"49+49-49=": ["49<eos>", "[49+49-49]", "7[49+49-49]"], "49+49-49=[49+49-49]49": "<eos>",
                         "49+49-49=7[49+49-49]49": "<eos>"})
    protocol = ToolProtocol.for_tokenizer(tok)
    out = rollout(gen, [_ids(tok, "49+49-49=")], dataclasses.replace(SAMPLING, n=3), protocol=protocol,
                  config=NO_STALL)
    assert [t.answer for t in out.trajectories] == ["49", "49", "749"]  # text before a call stays in the answer
    short = rollout(gen, [_ids(tok, "49+49-49=")], dataclasses.replace(SAMPLING, n=2, max_tokens=6),
                    protocol=protocol, config=NO_STALL)
    assert [t.answer for t in short.trajectories] == ["49", "[49+49"]  # cut off before "]": no call
    assert short.turns == 1


def test_a_call_without_an_opening_bracket_is_an_error(tok):
    gen = Scripted(tok, {"1+1=": "2]", "1+1=2]?": "2<eos>"})
    (traj,) = rollout(gen, [_ids(tok, "1+1=")], SAMPLING, protocol=ToolProtocol.for_tokenizer(tok),
                      config=NO_STALL).trajectories
    assert not traj.calls[0].ok
    assert traj.answer == "2"


def test_without_a_protocol_it_is_one_generate_call(tok):
    gen = Scripted(tok, {"12+7=": ["[12+7]19<eos>", "19<eos>"]})
    out = rollout(gen, [_ids(tok, "12+7=")], dataclasses.replace(SAMPLING, n=2), protocol=None)
    assert len(gen.calls) == 1
    assert gen.calls[0][1] == dataclasses.replace(SAMPLING, n=2)  # the caller's params, unchanged
    assert [t.answer for t in out.trajectories] == ["[12+7]19", "19"]
    assert all(len(t.turns) == 1 and not t.calls for t in out.trajectories)


def test_a_turn_waits_for_its_slowest_call(tok):
    script = {"1+2=": "[1+2]<eos>", "1+2=[1+2]3": "[3+3]", "1+2=[1+2]3[3+3]6": "<eos>", "4+4=": "8<eos>"}
    slept = []
    config = ToolConfig(latency_median_s=1.0, latency_p99_s=5.0)
    out = rollout(Scripted(tok, script), [_ids(tok, "1+2="), _ids(tok, "4+4=")], dataclasses.replace(SAMPLING, n=3),
                  protocol=ToolProtocol.for_tokenizer(tok), config=config, latency_key=(7, 3, 0), sleep=slept.append)
    assert out.turns == 3
    turn0 = config.latency.draw(3, (7, 3, 0, 0))  # the three samples of "1+2=" call at once
    turn1 = config.latency.draw(3, (7, 3, 0, 1))
    assert slept == [pytest.approx(turn0.max()), pytest.approx(turn1.max())]
    assert out.stall_s == pytest.approx(turn0.max() + turn1.max())
    assert [c.latency_s for c in out.trajectories[0].calls] == pytest.approx([turn0[0], turn1[0]])
    assert [t.answer for t in out.trajectories] == ["36"] * 3 + ["8"] * 3
    assert [len(t.calls) for t in out.trajectories] == [2, 2, 2, 0, 0, 0]


def test_a_tokenizer_without_tool_tokens_is_refused():
    plain = train_tokenizer(eval_problems(50))
    with pytest.raises(ValueError, match=r"no token for \[ \] \?.*tiny-arith-tools"):
        ToolProtocol.for_tokenizer(plain)


def test_answer_of_cuts_calls_and_failed_results():
    from engine.tasks.tools import ToolCall, Turn

    ok, bad = ToolCall("1+1", "2", [], 0.0), ToolCall("1+", ERROR_MARKER, [], 0.0)
    assert answer_of([Turn([], [], [], "[1+1]", ok), Turn([], [], [], "", None)]) == "2"
    assert answer_of([Turn([], [], [], "x[1+]", bad), Turn([], [], [], "3", None)]) == "x3"
    assert answer_of([Turn([], [], [], "42", None)]) == "42"
