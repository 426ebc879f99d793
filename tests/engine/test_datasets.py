"""A user's problems (JSONL, CSV, Parquet): validation that names the line or row, a fixed split, and a
GRPO run on them that is the same whatever file they came in."""

from __future__ import annotations

import json

import pytest

from engine.client import Client
from engine.errors import SpecError
from engine.rl import grpo
from engine.service.eventlog import EventLog, read_events
from engine.spec import JobSpec
from engine.tasks.arithmetic import Problem, sample_problems
from engine.tasks.datasets import (
    DatasetError,
    DatasetTask,
    held_out,
    load_problems,
    parse_dataset,
    split,
    to_jsonl,
)
from tests.datafiles import csv_bytes, parquet_bytes


def lines(*rows) -> list[str]:
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


def parse_problems(rows: list[str] | list[bytes]) -> list[Problem]:
    """The problems of a JSONL file of these lines."""
    return parse_dataset(b"\n".join(r if isinstance(r, bytes) else r.encode() for r in rows))


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


# the same problems as a table: a prompt with a comma, quotes and a line break
TABLE = [{"id": 1, "question": "1+1=", "solution": "2"}, {"id": 2, "question": 'say "3, then 4"\nnow', "solution": "7"},
         {"id": 3, "question": "half of 1", "solution": "0.5"}]
SAME = [Problem("1+1=", "2"), Problem('say "3, then 4"\nnow', "7"), Problem("half of 1", "0.5")]


def test_csv_and_parquet_with_mapped_columns_give_the_problems_the_jsonl_file_gives():
    as_jsonl = parse_problems(to_jsonl(SAME).splitlines())
    assert as_jsonl == SAME
    columns = {"prompt": "question", "answer": "solution"}  # the other column (id) is left out
    assert parse_dataset(csv_bytes(TABLE), "csv", **columns) == SAME
    assert parse_dataset(b"\xef\xbb\xbf" + csv_bytes(TABLE), "csv", **columns) == SAME  # a spreadsheet's BOM
    assert parse_dataset(parquet_bytes(TABLE), "parquet", **columns) == SAME
    mapped = b"".join(json.dumps({"q": p.prompt, "a": p.answer}).encode() + b"\n" for p in SAME)
    assert parse_dataset(mapped, "jsonl", prompt="q", answer="a") == SAME
    # a numeric answer column is written as Python writes its numbers, as a JSON number is
    numeric = parquet_bytes([{"question": "1+1=", "solution": 2}, {"question": "2+2=", "solution": 4}])
    assert parse_dataset(numeric, "parquet", **columns) == [Problem("1+1=", "2"), Problem("2+2=", "4")]


def test_a_file_is_read_in_the_format_its_name_says(tmp_path):
    rows = [{"prompt": r["question"], "answer": r["solution"]} for r in TABLE]
    (tmp_path / "p.csv").write_bytes(csv_bytes(rows))
    (tmp_path / "p.parquet").write_bytes(parquet_bytes(rows))
    (tmp_path / "p.jsonl").write_bytes(to_jsonl(SAME))
    assert load_problems(tmp_path / "p.csv") == load_problems(tmp_path / "p.parquet") == SAME
    assert load_problems(tmp_path / "p.jsonl") == SAME


CSV_HEADER = b"question,solution\n"


@pytest.mark.parametrize(("fmt", "data", "message"), [
    ("csv", b"prompt,solution\n1+1=,2\n", "no column 'question'; the file's columns: 'prompt', 'solution'"),
    ("csv", CSV_HEADER + b'"two\nlines",1\n3+3=,6,extra\n', "line 4: 3 fields; the header has 2"),
    ("csv", CSV_HEADER + b"1+1=,2\n2+2=,\n", 'line 3: "solution" must be a non-empty string'),
    ("csv", CSV_HEADER + b"1+1=,2\n1+1=,3\n", "line 3: the prompt appears twice"),
    ("csv", CSV_HEADER + b"1+1=,2\n\xff,3\n", "line 3: not UTF-8 text"),
    ("csv", CSV_HEADER + b'"1+1=,2\n', "line 2: not CSV"),
    ("csv", CSV_HEADER, "no problems"),
    ("csv", b"", "no header line"),
    ("parquet", b"PAR1 not really", "not a Parquet file"),
    ("parquet", "missing", "no column 'solution'"),
    ("parquet", "null", 'row 2: "solution" must be a non-empty string'),
    ("xlsx", CSV_HEADER, "unknown format 'xlsx'; known: jsonl, csv, parquet"),
])
def test_a_bad_table_is_named_by_its_line_or_row(fmt, data, message):
    if data == "missing":
        data = parquet_bytes([{"question": "1+1="}])
    elif data == "null":
        data = parquet_bytes([{"question": "1+1=", "solution": "2"}, {"question": "2+2=", "solution": None}])
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_dataset(data, fmt, prompt="question", answer="solution")


def test_the_prompt_and_the_answer_need_two_columns():
    with pytest.raises(DatasetError, match="both column 'q'"):
        parse_dataset(b"q\nx\n", "csv", prompt="q", answer="q")


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


def test_grpo_trains_on_a_dataset_and_a_csv_or_parquet_file_of_it_trains_the_same(router, job, tiny_model_dir,
                                                                                   arith_jsonl, tmp_path):
    problems = [json.loads(line) for line in arith_jsonl.read_text().splitlines()]
    (tmp_path / "problems.csv").write_bytes(csv_bytes(problems))
    (tmp_path / "problems.parquet").write_bytes(parquet_bytes(problems))
    runs = {}
    for path in (arith_jsonl, tmp_path / "problems.csv", tmp_path / "problems.parquet"):
        log = tmp_path / f"events-{path.suffix[1:]}.jsonl"
        events = EventLog(log)
        config = grpo.GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, max_tokens=4,
                                 eval_every=1, eval_size=10)
        summary = grpo.train(Client(router, events), job=f"{job}-{path.suffix[1:]}", model="tiny-arith",
                             task="dataset", steps=2, seed=0, config=config, dataset=str(path))
        events.close()
        runs[path.suffix] = [e["data"] for e in read_events(log) if e["kind"] == "metrics"]
        assert summary["steps"] == 2
    metrics = runs[".jsonl"]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("eval_accuracy" in m for m in metrics)
    for suffix in (".csv", ".parquet"):  # the same problems, the same seed: the same run
        assert runs[suffix] == metrics


def _jsonl(problems) -> str:
    return "".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems)


def test_an_evaluation_file_is_the_held_out_set_and_the_whole_dataset_trains(arith_jsonl, tmp_path):
    problems = load_problems(arith_jsonl)
    (tmp_path / "eval.jsonl").write_text(_jsonl(problems[:7]))
    task = DatasetTask(arith_jsonl, tmp_path / "eval.jsonl")
    assert (task.train, task.eval_set(100)) == (problems, problems[:7])
    with pytest.raises(SpecError, match="eval_dataset"):
        JobSpec(task="arith", eval_dataset=str(tmp_path / "eval.jsonl"))


def test_a_split_given_as_two_files_trains_as_the_one_file_split_does(router, job, arith_jsonl, tmp_path):
    """The dataset's own held-out split, uploaded as a training and an evaluation file: the same
    problems to train on and to evaluate on, the same seed, so the same run."""
    train, test = split(load_problems(arith_jsonl))
    (tmp_path / "train.jsonl").write_text(_jsonl(train))
    (tmp_path / "eval.jsonl").write_text(_jsonl(test))
    config = grpo.GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, max_tokens=4,
                             eval_every=1, eval_size=10)
    runs = []
    two = {"dataset": str(tmp_path / "train.jsonl"), "eval_dataset": str(tmp_path / "eval.jsonl")}
    for name, files in (("one", {"dataset": str(arith_jsonl)}), ("two", two)):
        log = tmp_path / f"events-{name}.jsonl"
        events = EventLog(log)
        grpo.train(Client(router, events), job=f"{job}-{name}", model="tiny-arith", task="dataset", steps=2, seed=0,
                   config=config, **files)
        events.close()
        runs.append([e["data"] for e in read_events(log) if e["kind"] == "metrics"])
    assert all("eval_accuracy" in m for m in runs[0])
    assert runs[0] == runs[1]
