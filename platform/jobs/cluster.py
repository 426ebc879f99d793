"""The cluster's load as the platform knows it, read from the database (a request never calls the
engine): every active job of every organization, and the device timeline of the last minutes (the
usage ledger's intervals per WPG, and how busy each WPG was).

Platform staff see everything in full; anyone else sees their own organization's jobs and
intervals in full and the others' anonymised: a job's state and the devices it reserves, an
interval's WPG, function, role, devices and times, never whose it is. The live cluster socket
(``jobs.consumers.ClusterConsumer``) anonymises with the same ``interval_for``.
"""

from __future__ import annotations

import time
from typing import Any

from accounts.models import Organization, User
from billing.models import UsageEntry
from jobs import broadcast
from jobs.models import ACTIVE_STATES, Job

TIMELINE_WINDOW_S = 600  # default window of the device timeline (GET cluster/?window=)
TIMELINE_MAX_WINDOW_S = 86_400
# The most intervals one timeline returns (the newest); more sets "truncated" and the utilisation
# counts only those returned.
TIMELINE_MAX_INTERVALS = 5000


def shown_in_full(*, user: User, organization: Organization | None, organization_id: int) -> tuple[bool, bool]:
    """(own, shown): whether a row of ``organization_id`` is the viewer's organization's, and
    whether the viewer may see whose it is (their own, or platform staff)."""
    own = organization is not None and organization_id == organization.pk
    return own, own or bool(user.is_staff)


def interval_for(interval: dict[str, Any], *, user: User, organization: Organization | None) -> dict[str, Any]:
    """A full interval of ``broadcast.usage_message`` as ``user`` acting in ``organization`` may
    see it: with ``own``, without ``organization_id``, and with job, name and organization null
    for another organization's call unless the user is staff."""
    seen = dict(interval)
    own, shown = shown_in_full(user=user, organization=organization, organization_id=seen.pop("organization_id"))
    seen["own"] = own
    if not shown:
        seen.update(job=None, name=None, organization=None)
    return seen


def cluster_view(*, user: User, organization: Organization | None, window: int = TIMELINE_WINDOW_S,
                 now: float | None = None) -> dict[str, Any]:
    """``{"jobs": [...], "active_jobs": n, "reserved_devices": n, "timeline": {...},
    "utilisation": [...]}``: the active jobs in queue order, the intervals of the calls that ended
    in the last ``window`` seconds (``timeline``) and each WPG's busy fraction over that window."""
    jobs = (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .select_related("organization")
        .only("id", "name", "state", "created_at", "rollout_devices", "train_devices",
              "organization_id", "organization__name")
        .order_by("created_at", "id")
    )
    rows = []
    for job in jobs:
        own, shown = shown_in_full(user=user, organization=organization, organization_id=job.organization_id)
        rows.append({
            "job": job.pk if shown else None,
            "name": job.name if shown else None,
            "organization": job.organization.name if shown else None,
            "state": job.state,
            "created_at": job.created_at if shown else None,
            "reserved_devices": job.reserved_devices,
            "own": own,
        })
    until = time.time() if now is None else now
    since = until - window
    timeline = device_timeline(user=user, organization=organization, since=since, until=until)
    return {"jobs": rows, "active_jobs": len(rows), "reserved_devices": sum(r["reserved_devices"] for r in rows),
            "timeline": timeline, "utilisation": utilisation(timeline["intervals"], since=since, until=until)}


def device_timeline(*, user: User, organization: Organization | None, since: float, until: float) -> dict[str, Any]:
    """``{"since", "until", "intervals": [...], "truncated"}``: the usage entries that ended in
    [since, until] (the newest ``TIMELINE_MAX_INTERVALS``), by start, each as the cluster socket
    sends it (``interval_for``) plus its ``seq`` (the entry's id, the socket's ``?last_seq=``)."""
    entries = recent_usage(since=since, until=until, limit=TIMELINE_MAX_INTERVALS + 1)
    truncated = len(entries) > TIMELINE_MAX_INTERVALS
    intervals = []
    for entry in sorted(entries[-TIMELINE_MAX_INTERVALS:], key=lambda e: (e.start, e.pk)):
        message = broadcast.usage_message(entry)
        intervals.append({"seq": message["seq"], **interval_for(message["interval"], user=user,
                                                                organization=organization)})
    return {"since": since, "until": until, "intervals": intervals, "truncated": truncated}


def recent_usage(*, since: float, until: float | None = None, after_seq: int = 0, limit: int) -> list[UsageEntry]:
    """The usage entries (of every organization) that ended at or after ``since`` (and at or
    before ``until``) with an id above ``after_seq``: the newest ``limit`` of them, by id, with
    their job and organization loaded for ``broadcast.usage_message``."""
    entries = UsageEntry.objects.filter(end__gte=since, pk__gt=after_seq)
    if until is not None:
        entries = entries.filter(end__lte=until)
    newest = list(entries.select_related("job", "organization").order_by("-id")[:limit])
    return newest[::-1]


def utilisation(intervals: list[dict[str, Any]], *, since: float, until: float) -> list[dict[str, Any]]:
    """Per WPG, by name: ``devices`` (the most any of its calls held) and ``busy_fraction``, the
    share of [since, until] in which at least one call ran on it (overlapping calls count once)."""
    by_wpg: dict[str, list[dict[str, Any]]] = {}
    for interval in intervals:
        by_wpg.setdefault(interval["wpg"], []).append(interval)
    span = max(until - since, 1e-9)
    rows = []
    for wpg, calls in sorted(by_wpg.items()):
        busy, reach = 0.0, since
        for start, end in sorted((max(c["start"], since), min(c["end"], until)) for c in calls):
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        rows.append({"wpg": wpg, "devices": max(c["devices"] for c in calls),
                     "busy_fraction": round(min(busy / span, 1.0), 6)})
    return rows
