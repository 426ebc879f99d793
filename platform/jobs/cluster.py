"""The cluster's load as the platform knows it: every active job of every organization, read from
the database (a request never calls the engine).

Platform staff see every job in full; anyone else sees their own organization's jobs in full and
the others' anonymised: only their state and the devices they reserve.
"""

from __future__ import annotations

from typing import Any

from accounts.models import Organization, User
from jobs.models import ACTIVE_STATES, Job


def cluster_view(*, user: User, organization: Organization | None) -> dict[str, Any]:
    """``{"jobs": [...], "active_jobs": n, "reserved_devices": n}``, the jobs in queue order."""
    jobs = (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .select_related("organization")
        .only("id", "name", "state", "created_at", "rollout_devices", "train_devices",
              "organization_id", "organization__name")
        .order_by("created_at", "id")
    )
    rows = []
    for job in jobs:
        own = organization is not None and job.organization_id == organization.pk
        shown = own or user.is_staff
        rows.append({
            "job": job.pk if shown else None,
            "name": job.name if shown else None,
            "organization": job.organization.name if shown else None,
            "state": job.state,
            "created_at": job.created_at if shown else None,
            "reserved_devices": job.reserved_devices,
            "own": own,
        })
    return {"jobs": rows, "active_jobs": len(rows), "reserved_devices": sum(r["reserved_devices"] for r in rows)}
