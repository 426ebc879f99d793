"""Data for the platform tests: the jobs endpoint and job specs, the engine events a job's log
holds (as ``jobs.ingest`` receives them), and datasets.

Two families of events: ``state``, ``metrics`` and ``usage`` build the events of an engine log
with positional fields (timestamps from ``seq``, the engine job ``job-x``); ``state_event``,
``metrics_event`` and ``usage_event`` build them by keyword, ``usage_event`` for a given job.
"""

import json

from django.core.files.uploadedfile import SimpleUploadedFile

from jobs import datasets
from jobs.ingest import ingest_events
from jobs.models import Dataset

JOBS = "/api/v1/jobs/"

# The smallest spec the API takes; the engine's JobSpec fills in the rest (the task's model...).
SPEC = {"task": "arith", "steps": 3}

# A spec the engine really runs in seconds: the tiny model, small batches (the live-process tests).
ENGINE_SPEC = {"task": "arith", "model": "tiny-arith", "steps": 3, "seed": 5, "rollout": "torch", "trainer": "torch",
               "grpo": {"prompts_per_step": 8, "samples_per_prompt": 4, "updates_per_step": 2, "eval_every": 3,
                        "eval_size": 10, "max_tokens": 6}}


def ingest(job, *events) -> int:
    return ingest_events(job=job, events=list(events))


# --- engine events, positional ---------------------------------------------------------------------


def usage(seq: int, call: int, start: float, end: float, *, devices: float = 1.0, queued: float = 0.0,
          setup: float = 0.0, wpg: str = "w", fn: str = "generate") -> dict:
    return {"seq": seq, "kind": "usage", "ts": end, "data": {
        "job": "job-x", "role": "policy", "fn": fn, "wpg": wpg, "devices": devices, "start": start, "end": end,
        "setup_s": setup, "exec_s": end - start - setup, "call": call, "tenant": "", "queued_s": queued}}


def state(seq: int, name: str, **extra) -> dict:
    return {"seq": seq, "kind": "state", "ts": 1000.0 + seq, "data": {"state": name, **extra}}


def metrics(seq: int, step: int) -> dict:
    return {"seq": seq, "kind": "metrics", "ts": 1000.0 + seq, "data": {"step": step, "reward_mean": 0.5}}


# --- engine events, by keyword ---------------------------------------------------------------------


def state_event(seq, state, ts=1.0, **data):
    return {"seq": seq, "kind": "state", "ts": ts, "data": {"state": state, **data}}


def metrics_event(seq, step, ts=2.0, **data):
    return {"seq": seq, "kind": "metrics", "ts": ts, "data": {"step": step, "reward": 0.5, **data}}


def usage_event(seq, *, job, call=1, start=10.0, end=12.0, devices=1.0, role="policy", fn="generate"):
    return {
        "seq": seq,
        "kind": "usage",
        "ts": end,
        "data": {
            "job": job.engine_id,
            "role": role,
            "fn": fn,
            "wpg": "w",
            "devices": devices,
            "start": start,
            "end": end,
            "setup_s": 0.0,
            "exec_s": end - start,
            "call": call,
            "tenant": "",
            "queued_s": 0.0,
        },
    }


# --- datasets --------------------------------------------------------------------------------------

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]


def jsonl(rows=ROWS) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def make_dataset(tenant, *, user=None, name="sums", rows=ROWS) -> Dataset:
    return datasets.dataset_create(organization=tenant.organization, user=user or tenant.member, name=name,
                                   upload=SimpleUploadedFile("d.jsonl", jsonl(rows)))


def streamed_body(response) -> bytes:
    """A streamed answer's body, read as the ASGI server reads it: asynchronously when it streams an
    async iterator (an artifact's archive), else as it iterates."""
    from asgiref.sync import async_to_sync

    async def read(content) -> bytes:
        return b"".join([chunk async for chunk in content])

    content = response.streaming_content
    return async_to_sync(read)(content) if response.is_async else b"".join(content)
