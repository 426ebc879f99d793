"""Checking that a webhook request came from your PlexRL platform, in your receiver:

    from plexrl_client.webhooks import verify

    def handle(headers, body: bytes):
        if not verify(SECRET, headers.get("PlexRL-Signature", ""), body):
            return 400
        event = json.loads(body)        # {"event": "job.failed", "organization": 7, "job": {...}}

The platform signs each request (``PlexRL-Signature: t=<unix seconds>,v1=<hex>``) with the
webhook's secret, shown once when the webhook was added: the HMAC-SHA256 of ``f"{t}."`` and the
body's bytes. ``verify`` recomputes it, compares in constant time, and refuses a ``t`` more than
``tolerance_s`` away from now (a request recorded and replayed later). A delivery is retried
until it answers 2xx, so the same ``PlexRL-Delivery`` id may come twice.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "PlexRL-Signature"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """Whether ``header`` (the request's ``PlexRL-Signature``) signs ``body`` with ``secret``,
    made within ``tolerance_s`` of ``now`` (default: the clock)."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))
