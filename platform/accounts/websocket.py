"""Authentication of websocket connections (``config.routing``): who connects, and in which
organization they act, resolved once per connection exactly as the REST API resolves a request.

Three ways in, tried in this order:

- ``?ticket=...``: a short-lived ticket from ``POST /api/v1/ws-ticket/`` (``ticket_issue``),
  signed, bound to a user and an organization and valid for ``TICKET_MAX_AGE_S``. For programs and
  pages that cannot set headers; a long-lived API token never goes in a URL (URLs end up in logs).
- ``Authorization: Bearer <token>``: an API token, checked like the REST API's
  (``BearerTokenAuthentication.authenticate_token``: revoked or expired tokens are refused); the
  token's organization is the one acted in.
- The Django session cookie, for browsers only: a connection with an ``Origin`` header, which
  ``BrowserOriginValidator`` has already checked against ALLOWED_HOSTS. The session's current
  organization is acted in (``accounts.api.session_membership``). A connection without ``Origin``
  (a program) is never authenticated by a cookie alone, so another site's page cannot ride on a
  user's cookie and a program must present a token or a ticket.

Bad credentials are not a handshake error: the connection is left anonymous with
``scope["auth_error"]`` saying why, and the consumers accept and close it with code 4401, which a
browser's ``WebSocket`` can read (a refused handshake only shows 1006).

The middleware sets ``scope["user"]`` (``AnonymousUser`` when unauthenticated),
``scope["organization"]`` and ``scope["membership"]`` (None without one), ``scope["auth"]``
(``"ticket"``, ``"token"``, ``"session"`` or None), ``scope["token"]`` (the ``ApiToken`` of a
token connection, else None) and ``scope["auth_error"]``.

Credentials that end close the sockets they opened, at once, not at the next connect: a consumer
joins its connection's ``credential_groups`` and closes with 4401 on a ``credentials.ended``
message, which ``close_sockets_on_commit`` sends when a token is revoked or a member removed; a
token's expiry closes its sockets on a timer (``seconds_left``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.models import AnonymousUser
from django.core import signing
from django.db import transaction
from django.http.cookie import parse_cookie
from django.utils import timezone
from django.utils.module_loading import import_string
from rest_framework import exceptions

from accounts import selectors
from accounts.api import session_membership, token_membership
from accounts.authentication import BearerTokenAuthentication
from accounts.models import ApiToken, Membership, Organization, User

logger = logging.getLogger(__name__)

TICKET_MAX_AGE_S = 60
_TICKET_SALT = "plexrl.accounts.websocket-ticket"


# --- tickets ---------------------------------------------------------------------------------------


def ticket_issue(*, user: User, organization: Organization | None) -> str:
    """A ticket for ``?ticket=``: signed (SECRET_KEY), bound to ``user`` and ``organization``
    (None: platform staff without one), valid ``TICKET_MAX_AGE_S`` seconds. Called by
    ``accounts.views.WebsocketTicketView``."""
    payload = {"u": user.pk, "o": organization.pk if organization else None}
    return signing.TimestampSigner(salt=_TICKET_SALT).sign_object(payload, compress=False)


def ticket_membership(ticket: str) -> tuple[User, Membership | None]:
    """The user and membership a ticket was issued for; ``AuthenticationFailed`` when it is
    forged, expired, or its user is inactive or no longer a member of its organization."""
    try:
        payload = signing.TimestampSigner(salt=_TICKET_SALT).unsign_object(ticket, max_age=TICKET_MAX_AGE_S)
    except signing.SignatureExpired:
        raise exceptions.AuthenticationFailed("This ticket has expired.") from None
    except (signing.BadSignature, ValueError, TypeError):
        raise exceptions.AuthenticationFailed("Invalid ticket.") from None
    user = User.objects.filter(pk=payload.get("u"), is_active=True).first() if isinstance(payload, dict) else None
    if user is None:
        raise exceptions.AuthenticationFailed("Invalid ticket.")
    if payload.get("o") is None:
        if not user.is_staff:
            raise exceptions.AuthenticationFailed("Invalid ticket.")
        return user, None
    membership = selectors.membership_of(user=user, organization=int(payload["o"]))
    if membership is None:
        raise exceptions.AuthenticationFailed("This ticket's user is no longer a member of its organization.")
    return user, membership


# --- the middleware --------------------------------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin1")
    return None


def _session_user(cookie_header: str | None) -> tuple[User | AnonymousUser, Any]:
    """The user of the request's Django session cookie (its auth hash verified, like a request's
    ``request.user``) and the session, or ``AnonymousUser``."""
    session_key = parse_cookie(cookie_header or "").get(settings.SESSION_COOKIE_NAME)
    if not session_key:  # (the session engine, config.sessions, refuses a key Django never issues)
        return AnonymousUser(), None
    session = import_string(f"{settings.SESSION_ENGINE}.SessionStore")(session_key)
    # django.contrib.auth.get_user reads only request.session: the same checks as an HTTP request
    return auth.get_user(SimpleNamespace(session=session)), session


def authenticate_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """What ``WebsocketAuthMiddleware`` adds to a connection's scope (see the module docstring).
    Synchronous (it queries the database)."""
    found: dict[str, Any] = {"user": AnonymousUser(), "organization": None, "membership": None,
                             "auth": None, "token": None, "auth_error": None}
    ticket = parse_qs(scope.get("query_string", b"").decode("latin1")).get("ticket")
    authorization = _header(scope, b"authorization")
    try:
        if ticket:
            user, membership = ticket_membership(ticket[-1])
            found["auth"] = "ticket"
        elif authorization:
            parts = authorization.split()
            if len(parts) != 2 or parts[0].lower() != BearerTokenAuthentication.keyword.lower():
                raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Bearer <token>'.")
            user, token = BearerTokenAuthentication().authenticate_token(parts[1])
            membership = token_membership(user=user, token=token)
            found.update(auth="token", token=token)
        elif _header(scope, b"origin") is not None:  # a browser, its Origin already validated
            user, session = _session_user(_header(scope, b"cookie"))
            if not user.is_authenticated:
                raise exceptions.NotAuthenticated("Log in, or connect with a token or a ticket.")
            membership = session_membership(user=user, session=session)
            found["auth"] = "session"
        else:
            raise exceptions.NotAuthenticated("Connect with an 'Authorization: Bearer' token or a ?ticket=.")
    except exceptions.APIException as exc:
        found["auth_error"] = str(exc.detail)
        return found
    found.update(user=user, membership=membership, organization=membership.organization if membership else None)
    return found


class WebsocketAuthMiddleware(BaseMiddleware):
    """Authenticate a websocket connection once, before its consumer runs (``authenticate_scope``).
    Wrap it in ``BrowserOriginValidator``, which checks a browser's Origin first."""

    async def __call__(self, scope, receive, send):
        scope = dict(scope, **await database_sync_to_async(authenticate_scope)(scope))
        return await super().__call__(scope, receive, send)


class BrowserOriginValidator(OriginValidator):
    """Channels' ``AllowedHostsOriginValidator``, except that a connection without an ``Origin``
    header (a program, not a browser) is let through: ``WebsocketAuthMiddleware`` then ignores its
    cookies, so it must bring a token or a ticket. A foreign Origin is refused at the handshake."""

    def __init__(self, application):
        allowed_hosts = settings.ALLOWED_HOSTS
        if settings.DEBUG and not allowed_hosts:
            allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
        super().__init__(application, allowed_hosts)

    async def __call__(self, scope, receive, send):
        """An ``Origin`` that is no URL (``http://[``: ``urlparse`` raises) is refused like a foreign
        one, where channels' validator would raise."""
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                try:
                    urlparse(value.decode("latin1"))
                except ValueError:
                    return await WebsocketDenier()(scope, receive, send)
        return await super().__call__(scope, receive, send)

    def valid_origin(self, parsed_origin) -> bool:
        return parsed_origin is None or self.validate_origin(parsed_origin)


# --- sockets whose credentials end ---------------------------------------------------------------

CREDENTIALS_ENDED = "credentials.ended"  # the message type (a consumer's ``credentials_ended``)


def token_group(token_id: int) -> str:
    """The Channels group of the sockets one API token opened."""
    return f"auth-token-{token_id}"


def member_group(user_id: int, organization_id: int) -> str:
    """The Channels group of the sockets a user opened in one organization (any credential)."""
    return f"auth-member-{user_id}-{organization_id}"


def credential_groups(scope: dict[str, Any]) -> list[str]:
    """The groups an authenticated connection joins to hear that its credentials ended."""
    groups = []
    if scope.get("token") is not None:
        groups.append(token_group(scope["token"].pk))
    if scope.get("organization") is not None:
        groups.append(member_group(scope["user"].pk, scope["organization"].pk))
    return groups


def seconds_left(scope: dict[str, Any]) -> float | None:
    """Seconds until the connection's token expires (None: no token, or one without expiry)."""
    token = scope.get("token")
    if token is None or token.expires_at is None:
        return None
    return max(0.0, (token.expires_at - timezone.now()).total_seconds())


def credentials_valid(scope: dict[str, Any]) -> bool:
    """Whether the connection's credentials still hold: its token neither revoked nor expired, its
    user still a member of its organization. A consumer asks once after joining its groups, so a
    revocation that committed between authentication and the join is not missed. Synchronous."""
    token = scope.get("token")
    if token is not None:
        fresh = ApiToken.objects.filter(pk=token.pk).first()
        if fresh is None or fresh.revoked_at is not None or fresh.is_expired():
            return False
    organization = scope.get("organization")
    return organization is None or selectors.membership_of(user=scope["user"], organization=organization) is not None


def group_send(group: str, message: dict[str, Any]) -> bool:
    """Send ``message`` to ``group`` now; False, logged, when the channel layer is down or missing
    (never raises: callers' writes have committed already). Used by every live push."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return False
        async_to_sync(layer.group_send)(group, message)
        return True
    except Exception:
        logger.warning("live push to %s failed", group, exc_info=True)
        return False


def close_sockets_on_commit(*groups: str) -> None:
    """Once the current transaction commits, close every socket in ``groups`` with 4401."""

    def send() -> None:
        for group in groups:
            group_send(group, {"type": CREDENTIALS_ENDED})

    transaction.on_commit(send)
