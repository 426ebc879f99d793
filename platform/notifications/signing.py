"""How a webhook's request is signed: ``PlexRL-Signature: t=<unix seconds>,v1=<hex>``, where hex is
the HMAC-SHA256, under the webhook's secret, of ``f"{t}."`` followed by the body's bytes. A receiver
recomputes it (the SDK's ``plexrl_client.webhooks.verify``), compares in constant time and refuses
an old ``t`` (a replayed request)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

HEADER = "PlexRL-Signature"


def new_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"
