"""The ``plexrl`` command end to end: a short training run's outputs, reproducibility across
processes, and bad input rejected in one line before any engine starts."""

import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.repo import REPO

TRAIN_FLAGS = [
    "--task", "arith", "--steps", "2", "--seed", "0",
    "--prompts-per-step", "32", "--samples-per-prompt", "4", "--eval-every", "1", "--eval-size", "20", "--json",
    "--rollout", "torch", "--trainer", "torch",
]
METRIC_KEYS = {"step", "reward_mean", "train_accuracy", "loss", "kl", "response_length", "eval_accuracy"}
HASH_SEEDS = ("0", "12345")


def _at_once(run, outs: list) -> None:
    """``run(hash_seed, out)`` for every hash seed at the same time: the fresh processes' start-ups
    overlap, and contending for the CPUs must not change a number."""
    with ThreadPoolExecutor(len(HASH_SEEDS)) as pool:
        for done in [pool.submit(run, h, out) for h, out in zip(HASH_SEEDS, outs, strict=True)]:
            done.result()


@pytest.fixture(scope="module")
def train_runs(run_plexrl, tiny_model_dir, plexrl_home, tmp_path_factory) -> dict:
    """The same two-step run in two fresh processes with different hash seeds: {hash seed: out dir}."""
    runs = {}

    def run(hash_seed: str, out) -> None:
        result = run_plexrl(
            "train", *TRAIN_FLAGS, "--model", str(tiny_model_dir), "--out", str(out),
            env={"PLEXRL_HOME": str(plexrl_home), "PYTHONHASHSEED": hash_seed},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[hash_seed] = (out, result)

    _at_once(run, [tmp_path_factory.mktemp(f"train-hash{hash_seed}") / "out" for hash_seed in HASH_SEEDS])
    return runs


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_writes_metrics_timings_and_summary(train_runs, tiny_model_dir):
    out, result = train_runs[HASH_SEEDS[0]]
    metrics = _rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for row in metrics:
        assert set(row) >= METRIC_KEYS, METRIC_KEYS - set(row)
        assert 0 <= row["reward_mean"] <= 1
        assert 0 <= row["train_accuracy"] <= 1
        assert 0 <= row["eval_accuracy"] <= 1
        assert 1 <= row["response_length"] <= 8
        assert all(math.isfinite(row[k]) for k in METRIC_KEYS)
    assert len(_rows(out / "timings.jsonl")) == 2

    summary = json.loads((out / "summary.json").read_text())
    for key in ("initial_accuracy", "final_accuracy"):
        assert isinstance(summary[key], float)
        assert 0 <= summary[key] <= 1
    assert summary["steps"] == 2
    assert summary["seed"] == 0
    assert summary["wall_seconds"] > 0
    # the final accuracy is the mean of the last (up to) three evaluations
    assert summary["final_accuracy"] == pytest.approx(sum(m["eval_accuracy"] for m in metrics[-3:]) / len(metrics[-3:]))
    # --json prints the summary that was written
    assert json.loads(result.stdout) == summary
    spec = json.loads((out / "spec.json").read_text())
    assert spec["model"] == str(tiny_model_dir.resolve())
    assert spec["grpo"]["prompts_per_step"] == 32
    states = [e["data"]["state"] for e in _rows(out / "events.jsonl") if e["kind"] == "state"]
    assert states == ["running", "succeeded"]


def test_timings_keep_their_step_number(train_runs):
    out, _ = train_runs[HASH_SEEDS[0]]
    assert [t["step"] for t in _rows(out / "timings.jsonl")] == [1, 2]


def test_train_is_reproducible_across_processes(train_runs):
    a, b = (train_runs[s][0] / "metrics.jsonl" for s in HASH_SEEDS)
    assert a.read_bytes() == b.read_bytes()
    # the runs really trained (some groups had mixed rewards), so updates are covered too
    assert any(row["groups_used"] > 0 and row["loss"] != 0 for row in _rows(a))
    summaries = [json.loads((train_runs[s][0] / "summary.json").read_text()) for s in HASH_SEEDS]
    for key in ("initial_accuracy", "final_accuracy", "accuracy_gain", "config"):
        assert summaries[0][key] == summaries[1][key]


# --- vLLM rollout + Megatron TP=2 training: the backends, same promise ----------------


def test_runs_into_folders_of_the_same_name_get_job_ids_of_their_own(tmp_path):
    from engine.cli.engine_commands import run_job_id
    from engine.spec import check_job_id

    a, b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    assert run_job_id(a) != run_job_id(b)  # their checkpoints go to folders of their own
    assert run_job_id(a) == run_job_id(tmp_path / "a" / ".." / "a" / "out")  # the same folder: the same id
    assert check_job_id(run_job_id(a)).startswith("out-")
    assert len(run_job_id(tmp_path / ("x" * 120))) <= 100


@pytest.fixture(scope="module")
def split_runs(run_plexrl, tiny_model_dir, plexrl_home, tmp_path_factory) -> list:
    """The same two-step run on vLLM + Megatron TP=2, twice, in fresh processes and Ray sessions."""
    flags = [f for f in TRAIN_FLAGS if f not in ("--rollout", "--trainer", "torch")]
    outs = [tmp_path_factory.mktemp(f"split-hash{hash_seed}") / "out" for hash_seed in HASH_SEEDS]

    def run(hash_seed: str, out) -> None:
        result = run_plexrl(
            "train", *flags, "--rollout", "vllm", "--trainer", "megatron", "--tp", "2",
            "--model", str(tiny_model_dir), "--out", str(out),
            env={"PLEXRL_HOME": str(plexrl_home), "PYTHONHASHSEED": hash_seed},
        )
        assert result.returncode == 0, result.stderr[-3000:]

    _at_once(run, outs)
    return outs


def test_vllm_megatron_tp2_run_is_reproducible(split_runs):
    a, b = split_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    rows = _rows(a / "metrics.jsonl")
    assert any(row["groups_used"] > 0 and row["loss"] != 0 for row in rows)  # it really trained
    spec = json.loads((a / "spec.json").read_text())
    assert (spec["rollout"], spec["trainer"], spec["tp"]) == ("vllm", "megatron", 2)
    syncs = [t["sync"] for t in _rows(a / "timings.jsonl")]
    assert len(syncs) == 2


# --- bad input ----------------------------------------------------------------------------------


BAD_INPUT = {
    "unknown-task": (["train", "--task", "nope"], "task: unknown task 'nope'"),
    "zero-steps": (["train", "--steps", "0"], "steps: must be a positive integer, got 0"),
    "negative-steps": (["train", "--steps", "-3"], "steps: must be a positive integer, got -3"),
    "bad-grpo-value": (["train", "--samples-per-prompt", "1"], "samples_per_prompt"),
    "bad-clip-eps-high": (["train", "--clip-eps-high", "1.5"], "clip_eps_high: must be in (0, 1), or 0 for clip_eps"),
    "missing-model": (["train", "--steps", "1", "--model", "/nonexistent/dir"], "'/nonexistent/dir'"),
    "out-in-proc": (["train", "--steps", "1", "--out", "/proc/forbidden"], "--out: cannot write to /proc/forbidden"),
    "unknown-rollout": (["train", "--rollout", "sglang"], "rollout: unknown backend 'sglang'; known: torch, vllm"),
    "bad-tp": (["train", "--tp", "0"], "tp: must be an integer from 1 to 8, got 0"),
    "tp-on-torch": (["train", "--trainer", "torch", "--tp", "2"], "tp: tensor parallelism needs the megatron trainer"),
    "unknown-preset": (["models", "build", "nope"], "unknown preset 'nope'"),
    "unknown-subcommand": (["nope"], "invalid choice: 'nope'"),
    "no-subcommand": ([], "required: command"),
    "unknown-flag": (["train", "--bogus"], "unrecognized arguments: --bogus"),
    "not-an-int": (["train", "--steps", "abc"], "argument --steps: invalid int value: 'abc'"),
    "tool-latency-negative": (["train", "--task", "arith-tools", "--tool-latency-median", "-1"],
                              "--tool-latency-median: must be a finite number of seconds >= 0"),
    "tool-latency-nan": (["train", "--task", "arith-tools", "--tool-latency-p99", "nan"],
                         "--tool-latency-p99: must be a finite number"),
    "tool-p99-below-median": (["train", "--task", "arith-tools", "--tool-latency-p99", "0.5"],
                              "--tool-latency-p99: must be >= the median (1.0), got 0.5"),
    "tool-latency-not-a-float": (["train", "--task", "arith-tools", "--tool-latency-median", "slow"],
                                 "argument --tool-latency-median: invalid float value: 'slow'"),
    "too-many-tool-calls": (["train", "--task", "arith-tools", "--max-tool-calls", "9"],
                            "--max-tool-calls: must be an integer from 0 to 8, got 9"),
    "tool-flags-on-a-plain-task": (["train", "--task", "arith", "--tool-latency-median", "0"],
                                   "tools: task 'arith' calls no tool"),
    "tool-task-on-a-plain-preset": (["train", "--task", "arith-tools", "--model", "tiny-arith"],
                                    "model: preset 'tiny-arith' was never taught the calculator"),
    "bench-remote-no-calls": (["bench", "remote", "--calls", "0"], "--calls must be at least 1"),
    "bench-remote-url-without-token": (["bench", "remote", "--url", "http://127.0.0.1:9"], "--token: no API token"),
}


def _assert_one_line_error(result, expected: str):
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("plexrl: error: "), lines[0]
    assert expected in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(("argv", "expected"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_line_and_exit_status_2(run_plexrl, tmp_path, argv, expected):
    # RAY_ADDRESS points nowhere: a command that got as far as starting the engine would fail loudly
    env = {"PLEXRL_HOME": str(tmp_path / "home"), "RAY_ADDRESS": "127.0.0.1:9"}
    result = run_plexrl(*argv, env=env, timeout=120)
    _assert_one_line_error(result, expected)
    assert not (tmp_path / "home" / "models").exists()  # no preset was built on the way


def test_a_model_that_does_not_split_over_tp_ranks_is_rejected(run_plexrl, tmp_path, tiny_model_dir):
    """tiny-arith has 2 attention heads: TP=4 cannot split them, and says so before any engine starts."""
    env = {"PLEXRL_HOME": str(tmp_path / "home"), "RAY_ADDRESS": "127.0.0.1:9"}
    out = tmp_path / "out"
    result = run_plexrl("train", "--steps", "1", "--model", str(tiny_model_dir), "--trainer", "megatron",
                        "--tp", "4", "--out", str(out), env=env, timeout=120)
    _assert_one_line_error(result, "--tp: model tiny-arith cannot train on megatron with --tp 4")
    assert "not divisible by tensor parallel size 4" in result.stderr
    assert not out.exists()


def test_out_under_a_file_is_rejected(run_plexrl, tmp_path, tiny_model_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"PLEXRL_HOME": str(tmp_path / "home"), "RAY_ADDRESS": "127.0.0.1:9"}
    result = run_plexrl("train", "--steps", "1", "--model", str(tiny_model_dir), "--out", str(blocker / "out"),
                        env=env, timeout=120)
    _assert_one_line_error(result, f"--out: cannot write to {blocker / 'out'}")


@pytest.mark.parametrize(("argv", "error"), [
    (["train", "--steps", "0"], "plexrl: error: steps: must be a positive integer"),
    (["models", "build", "nope"], "plexrl: error: preset: unknown preset 'nope'"),
])
def test_bad_input_is_refused_before_the_engine_loads(tmp_path, argv, error):
    """Bad input fails fast: ``plexrl train`` checks its spec, and ``plexrl models build`` the
    preset's name, before either imports torch or the engine's runtime (seconds a call: 3.2 s
    for an unknown preset before)."""
    probe = ("import sys, plexrl\n"
             f"code = plexrl.main({argv!r})\n"
             "print(code, sorted(m for m in ('torch', 'engine.service.runtime') if m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PLEXRL_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.split() == ["2", "[]"], (result.stdout, result.stderr[-2000:])
    assert result.stderr.strip().startswith(error)
