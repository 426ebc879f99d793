"""A job's driver: the algorithm loop, run inside the engine as a Ray actor (never in a web or
Celery process), talking to workers only through the function API.

It orchestrates and computes nothing heavy: arrays cross the API as numpy, so its process never
imports torch (``memory()`` says so, with its resident memory); many drivers fit beside the groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from engine.client import Client
from engine.errors import as_fault, is_engine_fault
from engine.scheduler.router import Router
from engine.service.eventlog import EventLog, LogEnded, read_events
from engine.spec import JobSpec
from engine.workers.group import WorkerGroup


def _last_checkpoint(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e["kind"] == "checkpoint"), None)


def resume_point(events: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
    """Where a job whose driver died goes on: its last checkpoint event's data (None: from the
    start), and the metrics it logged, by step (the steps it replays are not logged again)."""
    checkpoint = _last_checkpoint(events)
    logged = {e["data"]["step"]: e["data"] for e in events if e["kind"] == "metrics"}
    return (checkpoint["data"] if checkpoint else None), logged


def redone_after(events: list[dict[str, Any]]) -> int:
    """The seq after which a job's logged work is redone when its driver is replaced now: its last
    checkpoint event's (0: none, the job starts over). The usage logged after it is work the
    restart throws away and repeats; billing does not charge it (``redone_after_seq`` of the
    ``recovery`` event)."""
    checkpoint = _last_checkpoint(events)
    return checkpoint["seq"] if checkpoint else 0


def driver_memory() -> dict[str, Any]:
    """Where this driver runs, its resident memory (MB), and whether torch is loaded in it."""
    import sys

    import psutil

    return {"node": ray.get_runtime_context().get_node_id(), "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "torch": "torch" in sys.modules}


@ray.remote(num_cpus=0, max_calls=1)  # its process loads torch: it exits once done
def _export_checkpoint(checkpoint: str, model_dir: str, out: str) -> list[str]:
    from engine.errors import SpecError
    from engine.service.artifacts import export_hf

    if not Path(checkpoint).is_dir():
        raise SpecError("init_from", f"{checkpoint} is not a checkpoint folder (it was removed?)")
    return export_hf(Path(checkpoint), Path(model_dir), Path(out))


@ray.remote(num_cpus=0)
class JobDriver:
    """``resume``: this driver replaces one that died; it goes on from the job's last checkpoint."""

    def __init__(self, job_id: str, spec: JobSpec, groups: list[WorkerGroup], events_path: str,
                 tenant: str = "", resume: bool = False):
        self.job_id, self.spec = job_id, spec
        self.events = EventLog(Path(events_path))
        self.resume, logged = resume_point(read_events(self.events.path)) if resume else (None, {})
        self.client = Client(Router(groups, tenant=tenant), self.events,  # tenant: whose budget it spends
                             logged=logged, checkpoint=self.resume["path"] if self.resume else None)
        self.restarted = resume

    def note(self, kind: str, data: dict[str, Any]) -> int | None:
        """Append an event the engine service asks for (pause, resume) while ``run`` goes on: the
        driver stays the log's only writer. Needs the actor to run two calls at once
        (``max_concurrency=2``); the log serialises the appends. None, and nothing written, once
        ``run`` ended the job (a resume racing the job's failure must not make it look running)."""
        try:
            return self.events.append(kind, data, durable=True, after_own_end=False)
        except LogEnded:
            return None

    def memory(self) -> dict[str, Any]:
        return driver_memory()

    def _export(self, summary: dict[str, Any]) -> None:
        """The final weights as a Hugging Face folder beside the event log (``final/``)."""
        from engine.models import resolve_model
        from engine.service.artifacts import export_hf

        out = self.events.path.parent / "final"
        files = export_hf(Path(summary["final_checkpoint"]), resolve_model(self.spec.model, build_missing=False), out)
        self.events.append("artifact", {"name": "final", "path": str(out), "files": files}, durable=True)

    def _initial_model(self) -> str:
        """The folder the policy starts from: the spec's model, or with ``init_from`` that
        checkpoint's weights as a Hugging Face folder beside the event log (``init/``, written once
        by a task of its own: this process never imports torch; a replacement driver finds it)."""
        spec = self.spec
        if spec.init_from is None:
            return spec.model
        from engine.models import resolve_model

        out = self.events.path.parent / "init"
        if not (out / "config.json").is_file():
            base = resolve_model(spec.model, build_missing=False)
            ray.get(_export_checkpoint.remote(spec.init_from, str(base), str(out)))
            self.events.append("log", {"message": f"starting from the weights of checkpoint {spec.init_from}"})
        return str(out)

    def run(self) -> dict[str, Any]:
        from engine.rl import grpo

        spec = self.spec
        if not self.restarted:  # a replacement goes on in the state the job is in (running, paused)
            self.events.append("state", {"state": "running"}, durable=True)
        try:
            summary = grpo.train(self.client, job=self.job_id, model=self._initial_model(), task=spec.task,
                                 steps=spec.steps, seed=spec.seed, config=spec.grpo, tools=spec.tools,
                                 dataset=spec.dataset, resume=self.resume,
                                 eval_dataset=spec.eval_dataset)
            self._export(summary)
        except BaseException as exc:
            if is_engine_fault(exc):  # not the job's doing: the engine service recovers it
                raise as_fault(exc) from None
            self.events.append("state", {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"},
                               durable=True)
            raise
        self._profile()  # before the job is seen to succeed: whoever sees that finds its profile written
        self.events.append("state", {"state": "succeeded"}, durable=True)
        self.events.append("summary", summary, durable=True)
        return summary

    def _profile(self) -> None:
        """Keep what this job measured as the profile of its shape (``engine.accounting.estimate``), so the next
        job of that shape is estimated from it. Best effort: a job never fails for its profile."""
        from engine.accounting.estimate import write_profile

        try:
            usage = [e["data"] for e in read_events(self.events.path) if e["kind"] == "usage"]
            write_profile(self.spec, usage)
        except Exception as exc:
            self.events.append("log", {"message": f"profile not written: {type(exc).__name__}: {exc}"})
