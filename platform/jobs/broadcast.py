"""Live pushes to the dashboard: the websocket messages and their sends to Channels groups.

One implementation of each message shape, used both by the consumers' replay from the database
(``jobs.consumers``) and by the live sends after a write commits (``jobs.services``), so a point
looks the same whichever way it reached the browser. What is pushed is a view of what was
ingested (docs/architecture.md §5), never a second source of truth: a client that missed something
reconnects with ``?last_seq=`` and the replay fills the gap.

Groups and messages (every message is a JSON object with ``type`` and ``seq``):

- ``job-<id>`` (``/ws/jobs/<id>/``), ``seq`` = the event's seq in the job's log:
  ``{"type": "job", "seq": cursor, "job": {...}}`` a snapshot of the job (``job_message``),
  ``{"type": "metrics", "seq", "step", "data"}`` one step's metrics (``metrics_message``),
  ``{"type": "event", "seq", "kind", "data", "ts"}`` any other event (``event_message``).
- ``cluster`` (``/ws/cluster/``), ``seq`` = the usage entry's id in the billing ledger:
  ``{"type": "usage", "seq", "interval": {...}}`` one call's device interval (``usage_message``),
  sent in full to the group and anonymised per connection (``jobs.cluster.interval_for``).

Sends are made with ``transaction.on_commit`` (``send_on_commit``), so a rolled-back write pushes
nothing, and they never fail the write: when the channel layer is down they are logged and dropped
(clients catch up on their next connection).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from accounts import websocket
from billing.models import UsageEntry
from jobs.models import Job, JobEvent, JobMetric

logger = logging.getLogger(__name__)

CLUSTER_GROUP = "cluster"
# Messages per group send: a big ingest goes out in a few channel-layer messages, not one per point
# (channels-redis keeps at most 100 undelivered messages per connection).
BATCH = 500


def job_group(job_id: int) -> str:
    """The Channels group of one job's socket."""
    return f"job-{job_id}"


# --- message shapes ------------------------------------------------------------------------------


def job_message(job: Job) -> dict[str, Any]:
    """A snapshot of the job; its seq is the job's event cursor (everything up to it ingested)."""
    return {
        "type": "job",
        "seq": job.event_cursor,
        "job": {
            "id": job.pk,
            "name": job.name,
            "state": job.state,
            "state_reason": job.state_reason,
            "started_at": job.started_at.isoformat() if job.started_at else None,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "event_cursor": job.event_cursor,
        },
    }


def metrics_message(metric: JobMetric) -> dict[str, Any]:
    return {"type": "metrics", "seq": metric.seq, "step": metric.step, "data": metric.data}


def event_message(event: JobEvent) -> dict[str, Any]:
    return {"type": "event", "seq": event.seq, "kind": event.kind, "data": event.data, "ts": event.ts}


def usage_message(entry: UsageEntry) -> dict[str, Any]:
    """One call's interval, in full: the job, its name and organization (``entry.job`` and
    ``entry.organization`` loaded) and ``organization_id``, which ``jobs.cluster.interval_for``
    uses to anonymise it per viewer and then removes."""
    return {
        "type": "usage",
        "seq": entry.pk,
        "interval": {
            "wpg": entry.wpg,
            "job": entry.job_id,
            "name": entry.job.name,
            "organization": entry.organization.name,
            "organization_id": entry.organization_id,
            "fn": entry.fn,
            "role": entry.role,
            "devices": entry.devices,
            "start": entry.start,
            "end": entry.end,
        },
    }


# --- sends ---------------------------------------------------------------------------------------


def send(group: str, messages: list[dict[str, Any]]) -> None:
    """Send ``messages`` to ``group`` now, in batches (the consumers' ``push`` handler). Never
    raises: a channel layer that is down or missing is logged and the messages are dropped."""
    for i in range(0, len(messages), BATCH):
        if not websocket.group_send(group, {"type": "push", "messages": messages[i:i + BATCH]}):
            logger.warning("live push of %d messages to %s dropped; clients catch up when they reconnect",
                           len(messages) - i, group)
            return


def send_on_commit(group: str, messages: Iterable[dict[str, Any]]) -> None:
    """Send ``messages`` (built now, inside the transaction) once it commits; nothing if it rolls back."""
    messages = list(messages)
    if messages:
        transaction.on_commit(lambda: send(group, messages))
