"""The function API algorithm code is written against (and the only part of ``engine`` it sees).

    client = Client(router, events)
    policy = client.create_model(job, "policy", "tiny-arith", trainable=True,
                                 optimizer_config=OptimizerConfig(lr=1e-3))
    completions = policy.generate(prompts, SamplingParams(n=8)).result()

Every call returns a ``Future``; a handle is bound to a logical deployment (job, role) and does not
know where it runs. Data crossing the API is plain tensors and the small dataclasses re-exported
here.
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from engine.api import (
    ROLES,
    Batch,
    Completion,
    ForwardResult,
    LossResult,
    OptimizerConfig,
    SamplingParams,
)
from engine.errors import SpecError
from engine.models import resolve_model
from engine.scheduler.router import Future, Router, UsageSink
from engine.workers.tokenizer import load_plain_tokenizer

__all__ = [
    "Batch",
    "Client",
    "Completion",
    "ForwardResult",
    "Future",
    "LossResult",
    "ModelHandle",
    "OptimizerConfig",
    "SamplingParams",
    "SpecError",
]


class EventSink(Protocol):
    """Where a client appends its job's events: the job's ``EventLog`` (``engine.service.eventlog``),
    which the service that runs the job hands in."""

    def append(self, kind: str, data: dict[str, Any], *, durable: bool = False) -> int: ...


@lru_cache(maxsize=16)
def load_tokenizer(model_dir: str):
    return load_plain_tokenizer(model_dir)


class ModelHandle:
    """A (job, role) deployment. Methods mirror the API functions and return futures."""

    def __init__(self, router: Router, job: str, role: str, model_dir: Path, on_usage: UsageSink | None = None):
        self._router = router
        self.job, self.role, self.model_dir = job, role, model_dir
        self._on_usage = on_usage  # where each call's usage records go (the job's event log)

    def _call(self, fn: str, **payload: Any) -> Future:
        return self._router.call(self.job, self.role, fn, payload, self._on_usage)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> Future:
        """-> list[Completion], prompt-major: the n samples of prompt i are rows i*n .. i*n+n-1."""
        return self._call("generate", prompts=prompts, sampling=sampling)

    def forward(self, batch: Batch) -> Future:
        """-> ForwardResult: per-token log-probs of each completion under the current weights."""
        return self._call("forward", batch=batch)

    def forward_backward(self, batch: Batch, loss: str, loss_config: dict[str, Any] | None = None) -> Future:
        """-> LossResult; gradients accumulate until ``optim_step``."""
        return self._call("forward_backward", batch=batch, loss=loss, loss_config=dict(loss_config or {}))

    def optim_step(self) -> Future:
        """-> {"grad_norm", "tokens"}; applies and clears the accumulated gradients."""
        return self._call("optim_step")

    def sync_weights(self) -> Future:
        """-> {"bytes", "seconds"}; the trainer's weights become the ones ``generate`` samples from."""
        return self._call("sync_weights")

    def save_checkpoint(self, tag: str) -> Future:
        return self._call("save_checkpoint", tag=tag)

    def load_checkpoint(self, tag: str) -> Future:
        return self._call("load_checkpoint", tag=tag)


class Client:
    """``logged``: metrics already in the job's log, by step (a resumed job's driver replays the
    steps since its checkpoint: each is logged once, and a replayed step that comes out different
    is reported in the log). ``checkpoint``: the path of the job's checkpoint it resumed from."""

    def __init__(self, router: Router, events: EventSink | None = None, *,
                 logged: dict[int, dict[str, Any]] | None = None, checkpoint: str | None = None):
        self._router = router
        self._events = events
        self._on_usage = self._log_usage if events is not None else None
        self._jobs: list[str] = []  # jobs this client created models for
        self._logged = dict(logged or {})
        self._checkpoint = checkpoint

    def _log_usage(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._events.append("usage", record)

    def create_model(
        self,
        job: str,
        role: str,
        base: str,
        *,
        trainable: bool = False,
        optimizer_config: OptimizerConfig | None = None,
    ) -> ModelHandle:
        if role not in ROLES:
            raise SpecError("role", f"unknown role {role!r}; known: {', '.join(ROLES)}")
        model_dir = resolve_model(base)
        if job not in self._jobs:
            self._jobs.append(job)
        self._router.create(job, role, model_dir, trainable=trainable, optimizer=optimizer_config,
                            on_usage=self._on_usage)
        return ModelHandle(self._router, job, role, model_dir, self._on_usage)

    def tokenizer(self, handle_or_base: ModelHandle | str):
        """The model's tokenizer, loaded locally from its preset or folder (``PlainTokenizer`` where it
        has a ``tokenizer.json``: encoding then loads no torch into the caller)."""
        if isinstance(handle_or_base, ModelHandle):
            return load_tokenizer(str(handle_or_base.model_dir))
        return load_tokenizer(str(resolve_model(handle_or_base)))

    def log_metrics(self, step: int, values: dict[str, Any]) -> None:
        """Append a step's metrics to the job's event log (durably: a step boundary). The next
        step starts here, which the scheduler hears too (it aligns the job's steps)."""
        if self._events is not None:
            point = {"step": step, **values}
            before = self._logged.get(step)
            if before is None:
                self._events.append("metrics", point, durable=True)
            elif json.loads(json.dumps(point)) != before:  # as the log holds it
                changed = sorted(k for k in set(point) | set(before) if point.get(k) != before.get(k))
                self._events.append("log", {"message": f"step {step} replayed after a restart with "
                                                       f"different metrics: {', '.join(changed)}"}, durable=True)
        if self._router is not None:
            for job in self._jobs:
                self._router.mark_step(job)

    def log_timings(self, step: int, values: dict[str, float]) -> None:
        """Wall-clock seconds by phase; kept apart from metrics, which must not depend on timing."""
        if self._events is not None and step not in self._logged:
            self._events.append("timings", {"step": step, **values})

    def log_checkpoint(self, step: int, tag: str, path: str, state: dict[str, Any]) -> None:
        """The job can resume after ``step`` from checkpoint ``tag`` (at ``path``) and ``state``
        (what the algorithm needs beside the model: JSON). Logged durably once the checkpoint is
        in place; the previous one is then removed (a job keeps its latest)."""
        if self._events is None:
            return
        self._events.append("checkpoint", {"step": step, "tag": tag, "path": path, "state": state}, durable=True)
        previous, self._checkpoint = self._checkpoint, path
        if previous is not None and previous != path:
            shutil.rmtree(previous, ignore_errors=True)

    def log(self, message: str) -> None:
        if self._events is not None:
            self._events.append("log", {"message": message})
