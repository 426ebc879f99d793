"""The session engine (``settings.SESSION_ENGINE``): Django's database sessions, whose keys must be
of the characters Django issues.

A cookie may carry anything; Django's own check is only a length. A key with other characters (a
NUL byte makes PostgreSQL refuse the lookup: a 500 on every page, and a crashed websocket
handshake) is nobody's session: the request is anonymous, as with a key of no session.
"""

from __future__ import annotations

from django.contrib.sessions.backends.base import VALID_KEY_CHARS
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore

_VALID = frozenset(VALID_KEY_CHARS)


class SessionStore(DatabaseSessionStore):
    def _validate_session_key(self, key: str | None) -> bool:
        return super()._validate_session_key(key) and _VALID.issuperset(key)
