"""Reading a job's events from the engine service, for the tests that run jobs on it
(``test_service_api``, ``test_recovery``): wait by cursor until a condition holds, and the job's
states and metrics out of its events."""

from __future__ import annotations

import time

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


def states(events: list[dict]) -> list[str]:
    return [e["data"]["state"] for e in events if e["kind"] == "state"]


def metrics(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == "metrics"]


def finished(events: list[dict]) -> bool:
    return bool(states(events)) and states(events)[-1] in ("succeeded", "failed", "cancelled")
