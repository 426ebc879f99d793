"""A job's metrics, and its spec as the run's configuration, in the experiment trackers teams use:

    from plexrl_client import ServiceClient
    from plexrl_client.trackers import to_mlflow, to_tensorboard, to_wandb

    client = ServiceClient(url, token)
    to_tensorboard(client, 42, "runs/")                     # then: tensorboard --logdir runs/
    to_mlflow(client, 42, "file:./mlruns")                  # or an MLflow server's http(s) URI
    to_wandb(client, 42, project="rl", mode="offline")      # then: wandb sync

Each reads the job and its metrics through the API and writes them with the tracker's own client
library, on your machine, to your tracker: install the one you use (``tensorboard``,
``mlflow-skinny`` or ``mlflow``, ``wandb``). Every numeric metric of every step becomes a scalar
(a nested one named with ``/``, ``phase_seconds/generate``); the spec becomes the run's parameters
(flattened the same way) or, in TensorBoard, a text summary ``spec`` at step 0.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plexrl_client.errors import PlexRLError


def scalars(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The numbers in ``data`` (a step's metrics, a spec), nested keys joined with ``/``; the step
    itself, booleans, strings and lists are not scalars."""
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars(value, f"{name}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step":
            yield name, float(value)


def flat(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every leaf of ``data`` as text (a run's parameters), nested keys joined with ``/``."""
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from flat(value, f"{name}/")
        else:
            yield name, value if isinstance(value, str) else json.dumps(value)


def _need(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PlexRLError(f"this export needs {package}: pip install {package}") from None


def _job_and_steps(client: Any, job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return client.job(job_id), client.metrics(job_id)


def run_name(job: dict[str, Any]) -> str:
    return job.get("name") or f"job-{job['id']}"


def run_folder(job: dict[str, Any], *, by_id: bool = False) -> str:
    """A run's TensorBoard folder: its name, or with ``by_id`` its name and id (many jobs' folders
    side by side: names may repeat)."""
    return f"{run_name(job)}-{job['id']}" if by_id else run_name(job)


def tensorboard_files(job: dict[str, Any], steps: list[dict[str, Any]], logdir: str | os.PathLike) -> Path:
    """Write ``job``'s metrics (``steps``: the API's metrics rows) as a TensorBoard event file in
    ``logdir``; returns the file. TensorBoard's own writer and protocol buffers (no TensorFlow)."""
    _need("tensorboard", "tensorboard")
    from tensorboard.compat.proto import types_pb2
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    Path(logdir).mkdir(parents=True, exist_ok=True)
    before = set(Path(logdir).glob("events.out.tfevents.*"))
    writer = EventFileWriter(str(logdir))
    now = time.time()
    text = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    spec = TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=TensorShapeProto(),
                       string_val=[json.dumps(job.get("spec", {}), indent=2, sort_keys=True).encode()])
    writer.add_event(Event(step=0, wall_time=now, summary=Summary(value=[Summary.Value(tag="spec", metadata=text,
                                                                                        tensor=spec)])))
    for row in steps:
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars(row["data"])]
        writer.add_event(Event(step=row["step"], wall_time=now, summary=Summary(value=values)))
    writer.close()
    (written,) = set(Path(logdir).glob("events.out.tfevents.*")) - before
    return written


def to_tensorboard(client: Any, job_id: int, logdir: str | os.PathLike, *, by_id: bool = False) -> Path:
    """The job's metrics as a TensorBoard event file in ``logdir/<job name>/`` (``by_id``:
    ``logdir/<job name>-<id>/``, for many jobs whose names may repeat); returns the file."""
    job, steps = _job_and_steps(client, job_id)
    return tensorboard_files(job, steps, Path(logdir) / run_folder(job, by_id=by_id))


MLFLOW_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def to_mlflow(client: Any, job_id: int, tracking_uri: str, *, experiment: str = "plexrl") -> str:
    """The job as an MLflow run of ``experiment`` (made if missing) at ``tracking_uri``: its spec
    as parameters, its metrics by step, the job's id and state as tags; returns the run's id.
    MLflow's own refusals (an unreachable server, a file store it was not allowed to use) come as
    a ``PlexRLError`` with its message."""
    _need("mlflow", "mlflow-skinny")
    from mlflow.exceptions import MlflowException

    job, steps = _job_and_steps(client, job_id)
    try:
        return _mlflow_run(job, steps, tracking_uri, experiment)
    except MlflowException as exc:
        raise PlexRLError(f"MLflow at {tracking_uri}: {exc.message}") from None


def _mlflow_run(job: dict[str, Any], steps: list[dict[str, Any]], tracking_uri: str, experiment: str) -> str:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    tracker = MlflowClient(tracking_uri)
    found = tracker.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else tracker.create_experiment(experiment)
    tags = {"plexrl.job_id": str(job["id"]), "plexrl.state": job["state"]}
    run = tracker.create_run(experiment_id, run_name=run_name(job), tags=tags)
    params = [Param(key, value[:6000]) for key, value in flat(job.get("spec", {}))]
    at = int(time.time() * 1000)
    metrics = [Metric(key, value, at, row["step"]) for row in steps for key, value in scalars(row["data"])]
    run_id = run.info.run_id
    for start in range(0, len(params), 100):  # MLflow's limits on a batch: 100 parameters, 1000 metrics
        tracker.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(metrics), 1000):
        tracker.log_batch(run_id, metrics=metrics[start:start + 1000])
    tracker.set_terminated(run_id, status=MLFLOW_STATUS.get(job["state"], "RUNNING"))
    return run_id


def to_wandb(client: Any, job_id: int, *, project: str, mode: str = "offline",
             directory: str | os.PathLike | None = None) -> str:
    """The job as a Weights & Biases run of ``project`` (``mode="offline"``: written under
    ``directory`` for ``wandb sync`` later; ``"online"``: to your account); returns the run's id."""
    wandb = _need("wandb", "wandb")
    job, steps = _job_and_steps(client, job_id)
    run = wandb.init(project=project, name=run_name(job), config=job.get("spec", {}), mode=mode,
                     dir=str(directory or tempfile.gettempdir()), reinit="create_new",
                     tags=[f"plexrl-job-{job['id']}"])
    try:
        for row in steps:
            run.log(dict(scalars(row["data"])), step=row["step"])
    finally:
        run.finish()
    return run.id
