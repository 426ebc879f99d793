"""A local engine: Ray started in this process, long-lived worker groups, jobs run by drivers."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from engine.paths import plexrl_home
from engine.service.eventlog import read_events
from engine.spec import JobSpec
from engine.workers.backend import BackendKind
from engine.workers.devices import accelerator_count
from engine.workers.group import DEVICE_RESOURCE, Swapping, WorkerGroup


def default_devices() -> int:
    """Device slots of this node: its GPUs, or on a CPU machine two logical slots."""
    return accelerator_count() or 2


@dataclass(frozen=True)
class EngineConfig:
    devices: int = field(default_factory=default_devices)  # device slots on this node
    threads_per_rank: int = 2  # torch intra-op threads of every WPG rank, fixed for determinism
    num_cpus: int = 2


def start_ray(config: EngineConfig) -> None:
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local-only cluster, no token files
    ray.init(
        # A new local instance, always: with no address, Ray would join the last cluster that
        # `ray start` ran on this machine (its address stays in /tmp/ray even after it stopped).
        address="local",
        num_cpus=config.num_cpus,
        num_gpus=accelerator_count(),
        resources={DEVICE_RESOURCE: config.devices},
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        configure_logging=False,
        namespace="plexrl",
    )


class LocalEngine:
    """Ray plus the worker groups of one node; ``with LocalEngine() as engine: engine.run_job(...)``."""

    def __init__(self, config: EngineConfig | None = None, *, data_dir: Path | None = None):
        self.config = config or EngineConfig()
        self.data_dir = Path(data_dir) if data_dir else plexrl_home()
        self.groups: list[WorkerGroup] = []
        self._owns_ray = False

    def __enter__(self) -> LocalEngine:
        self._owns_ray = not ray.is_initialized()
        start_ray(self.config)
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def start_group(
        self, name: str, kind: BackendKind | str = BackendKind.TORCH, world_size: int = 1, *,
        devices_per_rank: float = 1.0, threads: int | None = None, swapping: Swapping | None = None,
        serves: frozenset[str] | None = None,
    ) -> WorkerGroup:
        group = WorkerGroup.start(name, kind, world_size=world_size, threads=threads or self.config.threads_per_rank,
                                  data_dir=self.data_dir, devices_per_rank=devices_per_rank, swapping=swapping,
                                  serves=serves)
        self.groups.append(group)
        return group

    def threads_per_rank(self, world_size: int) -> int:
        """Ranks of one group compute at the same time, so they share the per-rank threads."""
        return max(1, self.config.threads_per_rank // world_size)

    def start_groups_for(self, spec: JobSpec) -> list[WorkerGroup]:
        """The worker groups one job's backends need: a training WPG of ``spec.tp`` ranks and, unless
        one torch group serves both sides, a rollout WPG of one rank.

        The groups share the node's device slots (a job's phases alternate, so its WPGs take turns);
        a TP group's ranks run at the same time, so they split the per-rank threads between them.
        Both choices are fixed by the config and the spec, never by load, so runs stay reproducible.
        """
        colocated = spec.trainer == spec.rollout == BackendKind.TORCH
        ranks = spec.tp + (0 if colocated else 1)
        per_rank = min(1.0, self.config.devices / ranks)
        started = [self.start_group(f"{spec.trainer}-0", spec.trainer, spec.tp, devices_per_rank=per_rank,
                                    threads=self.threads_per_rank(spec.tp))]
        if not colocated:
            started.append(self.start_group(f"{spec.rollout}-rollout-0", spec.rollout, 1, devices_per_rank=per_rank))
        return started

    def shutdown(self) -> None:
        for g in self.groups:
            g.shutdown()
        self.groups.clear()
        if self._owns_ray and ray.is_initialized():
            from engine.scheduler.live import stop_scheduler
            from engine.state.manager import stop_state_manager

            stop_scheduler()
            stop_state_manager()
            ray.shutdown()

    def run_job(
        self, job_id: str, spec: JobSpec, events_path: Path,
        on_event: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 0.2,
    ) -> dict[str, Any]:
        """Run one job's driver to completion, feeding each new event to ``on_event``."""
        if not self.groups:
            self.start_groups_for(spec)
        forward = None if on_event is None else (lambda _job, event: on_event(event))
        return run_jobs([JobRun(job_id, spec, Path(events_path))], self.groups, forward, poll_s)[job_id]


@dataclass(frozen=True)
class JobRun:
    job_id: str
    spec: JobSpec
    events_path: Path


def run_jobs(
    runs: list[JobRun], groups: list[WorkerGroup],
    on_event: Callable[[str, dict[str, Any]], None] | None = None, poll_s: float = 0.2,
) -> dict[str, dict[str, Any]]:
    """Run several jobs' drivers at once over ``groups`` (the scheduler time-slices the groups
    they share) until all have finished; ``on_event(job_id, event)`` sees each job's events in
    order. Returns each job's summary. If one job fails, the others are stopped and it raises."""
    from engine.service.driver import JobDriver

    drivers = {r.job_id: JobDriver.options(name=f"driver:{r.job_id}").remote(r.job_id, r.spec, groups,
                                                                              str(r.events_path))
               for r in runs}
    pending = {drivers[r.job_id].run.remote(): r for r in runs}
    seen = dict.fromkeys(drivers, 0)
    summaries: dict[str, dict[str, Any]] = {}

    def drain(run: JobRun) -> None:
        for event in read_events(run.events_path, after_seq=seen[run.job_id]):
            seen[run.job_id] = event["seq"]
            if on_event is not None:
                on_event(run.job_id, event)

    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
            for run in runs:
                drain(run)
            for ref in ready:
                run = pending.pop(ref)
                summaries[run.job_id] = ray.get(ref)
                drain(run)
    finally:
        for driver in drivers.values():
            ray.kill(driver)
    return summaries


def write_run_outputs(events_path: Path, out: Path, summary: dict[str, Any]) -> None:
    """Derive metrics.jsonl (timing-free), timings.jsonl and summary.json from the event log."""
    events = read_events(events_path)
    with (out / "metrics.jsonl").open("w") as f:
        for e in events:
            if e["kind"] == "metrics":
                f.write(json.dumps(e["data"]) + "\n")
    with (out / "timings.jsonl").open("w") as f:
        for e in events:
            if e["kind"] == "timings":
                f.write(json.dumps(e["data"]) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
