"""The tasks a job can name (``JobSpec.task``), and the one lookup that builds a task from its name."""

from __future__ import annotations

from engine.tasks.arithmetic import ArithTask, ArithToolsTask
from engine.tasks.datasets import DatasetTask


class _DatasetEntry:
    """The ``dataset`` task's entry in TASKS: a user's JSONL problems (``DatasetTask``), named by the
    spec's ``dataset`` path."""

    name = "dataset"
    default_model = None
    uses_tools = False


TASKS = {"arith": ArithTask, "arith-tools": ArithToolsTask, "dataset": _DatasetEntry}


def get_task(name: str, dataset: str | None = None, eval_dataset: str | None = None) -> ArithTask:
    if name == "dataset":
        if not dataset:
            raise ValueError("task 'dataset' needs the path of a dataset")
        return DatasetTask(dataset, eval_dataset)
    try:
        return TASKS[name]()
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}") from None
