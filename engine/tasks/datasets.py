"""A user's own problems for the ``dataset`` task: a JSONL file of ``{"prompt": ..., "answer": ...}``
lines, a CSV file or a Parquet file, its prompt and answer in columns of any name.

One loader validates a file for both faces: the platform calls it on upload (errors name the line
of a JSONL or CSV file, the row of a Parquet one), the engine calls it when a job starts. CSV is
read by the standard library's ``csv`` module and Parquet by ``pyarrow``; every format goes through
the same checks, so the same problems give the same run whatever file they came in. The train /
held-out split is fixed by content, as for the arithmetic task: a problem is held out when a SHA-256
of its prompt falls in one bucket of ten, so the split is the same in every process and a run never
trains on a held-out problem.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import DatasetError
from engine.tasks.arithmetic import ArithTask, Problem

MAX_BYTES = 20 * 1024 * 1024
MAX_PROBLEMS = 200_000
MAX_FIELD_CHARS = 4096
MIN_HELD_OUT = 1  # a dataset must leave something to evaluate on
HELD_OUT_BUCKETS = 10
FORMATS = ("jsonl", "csv", "parquet")
FIELDS = ("prompt", "answer")  # the fields of the JSONL file the engine reads (``to_jsonl``)
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


def format_of(name: str) -> str:
    """A file's format from its name's suffix (JSONL when it says nothing else)."""
    return SUFFIXES.get(Path(name).suffix.lower(), "jsonl")


def parse_dataset(data: bytes, fmt: str = "jsonl", *, prompt: str = FIELDS[0],
                  answer: str = FIELDS[1]) -> list[Problem]:
    """Problems from a whole file in ``fmt`` (one of FORMATS), the prompt in field or column
    ``prompt`` and the answer in ``answer``. A JSONL line may hold no other field; a table's other
    columns are left out; blank lines are skipped. DatasetError names the first bad line (JSONL,
    CSV; counting from 1) or row (Parquet)."""
    columns = (prompt, answer)
    if prompt == answer:
        raise DatasetError(f"the prompt and the answer are both column {prompt!r}")
    if fmt == "jsonl":
        return _problems(_jsonl_rows(data.splitlines(), columns), columns)
    if fmt == "csv":
        return _problems(_csv_rows(data, columns), columns)
    if fmt == "parquet":
        return _problems(_parquet_rows(data, columns), columns)
    raise DatasetError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def to_jsonl(problems: Iterable[Problem]) -> bytes:
    """The problems as the JSONL file the engine reads (``{"prompt", "answer"}`` a line)."""
    return b"".join(json.dumps({"prompt": p.prompt, "answer": p.answer}).encode() + b"\n" for p in problems)


def _jsonl_rows(lines: list[bytes] | list[str], columns: tuple[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
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
            raise DatasetError(f"line {number}: expected an object with \"{columns[0]}\" and \"{columns[1]}\"")
        extra = sorted(set(row) - set(columns))
        if extra:
            raise DatasetError(f"line {number}: unknown field {extra[0]!r} "
                               f"(only \"{columns[0]}\" and \"{columns[1]}\")")
        yield f"line {number}", row


def _csv_rows(data: bytes, columns: tuple[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as spreadsheets write, is not a column
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DatasetError(f"line {line}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if not header:
            raise DatasetError("no problems: the file has no header line")
        _has_columns(header, columns)
        at = [header.index(column) for column in columns]
        for values in reader:  # its line_num: the last line of the record (a quoted value may span several)
            if not any(values):  # a blank line
                continue
            where = f"line {reader.line_num}"
            if len(values) != len(header):
                raise DatasetError(f"{where}: {len(values)} fields; the header has {len(header)}")
            yield where, {column: values[i] for column, i in zip(columns, at, strict=True)}
    except csv.Error as exc:
        raise DatasetError(f"line {reader.line_num}: not CSV ({exc})") from None


def _parquet_rows(data: bytes, columns: tuple[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(io.BytesIO(data))
        _has_columns(table.schema_arrow.names, columns)
        rows = table.read(columns=list(columns)).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"not a Parquet file ({exc})") from None
    for number, row in enumerate(rows, start=1):
        yield f"row {number}", row


def _has_columns(names: list[str], columns: tuple[str, str]) -> None:
    for column in columns:
        if column not in names:
            raise DatasetError(f"no column {column!r}; the file's columns: {', '.join(map(repr, names))}")


def _problems(rows: Iterator[tuple[str, dict[str, Any]]], columns: tuple[str, str]) -> list[Problem]:
    """The problems of ``rows`` ((where, row) pairs), checked alike whatever the format."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for where, row in rows:
        prompt = _text(where, columns[0], row.get(columns[0]), number=False)
        answer = _text(where, columns[1], row.get(columns[1]), number=True)
        if prompt in seen:
            raise DatasetError(f"{where}: the prompt appears twice")
        seen.add(prompt)
        problems.append(Problem(prompt=prompt, answer=answer))
        if len(problems) > MAX_PROBLEMS:
            raise DatasetError(f"{where}: more than {MAX_PROBLEMS} problems")
    if not problems:
        raise DatasetError("no problems: the file has no non-blank line")
    return problems


def _text(where: str, column: str, value: Any, *, number: bool) -> str:
    """A field's text; an answer may also be a number (written as Python writes it)."""
    if number and isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: \"{column}\" must be a non-empty string")
    if len(value) > MAX_FIELD_CHARS:
        raise DatasetError(f"{where}: \"{column}\" is longer than {MAX_FIELD_CHARS} characters")
    return value


def load_problems(path: Path) -> list[Problem]:
    """The problems of a file in the format its suffix names (``format_of``), with the fields or
    columns ``prompt`` and ``answer``."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    if size > MAX_BYTES:
        raise DatasetError(f"{size} bytes; the limit is {MAX_BYTES}")
    return parse_dataset(path.read_bytes(), format_of(path.name))


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
    """Train on a file's problems with the math-verify reward; evaluate on its held-out split, or
    with ``eval_path`` train on all of them and evaluate on that file's."""

    name = "dataset"
    default_model = None  # a user's problems: the job names its model

    def __init__(self, path: Path, eval_path: Path | None = None):
        if eval_path is None:
            self.train, self.test = split(load_problems(path))
        else:
            self.train, self.test = load_problems(path), load_problems(eval_path)

    def train_batch(self, seed: int, step: int, n: int) -> list[Problem]:
        rng = np.random.default_rng([seed, step])
        return [self.train[i] for i in rng.integers(0, len(self.train), size=n)]

    def eval_set(self, n: int) -> list[Problem]:
        return self.test[:n]
