"""A user's own problems: a JSONL file of ``{"prompt": ..., "answer": ...}`` lines (the ``dataset`` task).

One loader validates a file for both faces: the platform calls it on upload (errors name the line),
the engine calls it when a job starts. The train / held-out split is fixed by content, as for the
arithmetic task: a problem is held out when a SHA-256 of its prompt falls in one bucket of ten, so
the split is the same in every process and a run never trains on a held-out problem.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from engine.errors import DatasetError
from engine.tasks.arithmetic import ArithTask, Problem

MAX_BYTES = 20 * 1024 * 1024
MAX_PROBLEMS = 200_000
MAX_FIELD_CHARS = 4096
MIN_HELD_OUT = 1  # a dataset must leave something to evaluate on
HELD_OUT_BUCKETS = 10


def parse_problems(lines: list[bytes] | list[str]) -> list[Problem]:
    """Problems from JSONL lines (blank lines are skipped); raises DatasetError naming the first bad
    line, counting from 1."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise DatasetError(f"line {number}: not UTF-8 text") from None
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"line {number}: expected an object with \"prompt\" and \"answer\"")
        extra = sorted(set(row) - {"prompt", "answer"})
        if extra:
            raise DatasetError(f"line {number}: unknown field {extra[0]!r} (only \"prompt\" and \"answer\")")
        for field in ("prompt", "answer"):
            value = row.get(field)
            if isinstance(value, int | float) and not isinstance(value, bool) and field == "answer":
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise DatasetError(f"line {number}: \"{field}\" must be a non-empty string")
            if len(value) > MAX_FIELD_CHARS:
                raise DatasetError(f"line {number}: \"{field}\" is longer than {MAX_FIELD_CHARS} characters")
            row[field] = value
        if row["prompt"] in seen:
            raise DatasetError(f"line {number}: the prompt appears twice")
        seen.add(row["prompt"])
        problems.append(Problem(prompt=row["prompt"], answer=row["answer"]))
        if len(problems) > MAX_PROBLEMS:
            raise DatasetError(f"line {number}: more than {MAX_PROBLEMS} problems")
    if not problems:
        raise DatasetError("no problems: the file has no non-blank line")
    return problems


def load_problems(path: Path) -> list[Problem]:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    if size > MAX_BYTES:
        raise DatasetError(f"{size} bytes; the limit is {MAX_BYTES}")
    return parse_problems(path.read_bytes().splitlines())


def held_out(problem: Problem) -> bool:
    return hashlib.sha256(problem.prompt.encode()).digest()[0] % HELD_OUT_BUCKETS == 0


def split(problems: list[Problem]) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out); a dataset too small to hold one out in ten keeps its last problem apart."""
    train = [p for p in problems if not held_out(p)]
    test = [p for p in problems if held_out(p)]
    if len(test) < MIN_HELD_OUT and len(problems) > 1:
        train, test = problems[:-1], problems[-1:]
    if not train:
        raise DatasetError("every problem fell in the held-out split; add more problems")
    return train, test


class DatasetTask(ArithTask):
    """Train on a JSONL file's problems with the math-verify reward; evaluate on its held-out split."""

    name = "dataset"
    default_model = None  # a user's problems: the job names its model

    def __init__(self, path: Path):
        self.train, self.test = split(load_problems(path))

    def train_batch(self, seed: int, step: int, n: int) -> list[Problem]:
        rng = np.random.default_rng([seed, step])
        return [self.train[i] for i in rng.integers(0, len(self.train), size=n)]

    def eval_set(self, n: int) -> list[Problem]:
        return self.test[:n]
