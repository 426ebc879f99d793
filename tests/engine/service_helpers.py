"""Reading a job's events from the engine service, for the tests that run jobs on it
(``test_service_api``, ``test_recovery``): wait by cursor until a condition holds, and the job's
states and metrics out of its events."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from engine.control import EngineClient


def wait_for(engine: EngineClient, job: str, predicate, timeout: float = 180.0) -> list[dict]:
    """Read the job's events by cursor until ``predicate(all events so far)`` holds."""
    seen: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = engine.events(job, after_seq=seen[-1]["seq"] if seen else 0, limit=7)
        seen += batch
        if predicate(seen):
            return seen
        if not batch:
            time.sleep(0.1)
    raise AssertionError(f"{job}: condition not met in {timeout} s; last events {seen[-3:]}")


def pause_after_step(engine: EngineClient, job: str, step: int, timeout: float = 240.0) -> None:
    """Pause ``job`` once it has logged ``step`` (its checkpoint then exists), so that what a test
    does to it next happens mid-run: a tiny job's step takes a fraction of a second, and one left
    running could end before a fault or a drain reaches it. The step running then finishes; no
    other starts until ``engine.resume(job)``."""
    wait_for(engine, job, lambda events: any(m["step"] >= step for m in metrics(events)), timeout=timeout)
    answer = engine.pause(job)
    assert answer["state"] == "paused", f"{job} was no longer running to pause: {answer}"


def states(events: list[dict]) -> list[str]:
    return [e["data"]["state"] for e in events if e["kind"] == "state"]


def metrics(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == "metrics"]


def usage_device_s(events: list[dict]) -> list[float]:
    """Device-seconds of each usage record: one per worker group a call held."""
    return [e["data"]["devices"] * (e["data"]["end"] - e["data"]["start"]) for e in events if e["kind"] == "usage"]


def finished(events: list[dict]) -> bool:
    return bool(states(events)) and states(events)[-1] in ("succeeded", "failed", "cancelled")


@contextlib.contextmanager
def worker_nodes(count: int) -> Iterator[tuple[Any, list[Any]]]:
    """For a probe process: a Ray cluster of its own on this machine, a head node with no device
    slots (where the platform's process runs) and ``count`` worker nodes of one device slot each,
    a node group each, joined by this process; yields (the cluster, its worker nodes) once they are
    up, and shuts it down after."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    # no dashboard: its modules cost 2-4 CPU-seconds a cluster, and the tests read the cluster from Ray
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, resources={"device": 1}) for _ in range(count)]
    ray.init(address=cluster.address, log_to_driver=False, namespace="plexrl")
    try:
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()
