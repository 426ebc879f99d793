"""Bearer-token authentication for the REST API (``Authorization: Bearer plx_...``).

Listed first in ``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]`` (before Django sessions), so
DRF answers 401 with a ``WWW-Authenticate: Bearer`` header when credentials are missing or bad.
The token's organization becomes the request's organization in ``accounts.api``.
"""

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts import selectors
from accounts.models import ApiToken, User, token_digest

# last_used_at is refreshed at most this often, so a busy client does not write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """Authenticate by an API token; sets ``request.user`` to its user and ``request.auth`` to the
    ``ApiToken``. Revoked or expired tokens and inactive users get 401 with a message saying which.

    The token is found by its SHA-256 digest (a unique index), so the secret is never compared
    character by character and its timing reveals nothing; the same query loads its user's
    membership (``selectors.token_by_digest``).
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None  # not ours: let session authentication try
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected 'Bearer <token>'.")
        try:
            plaintext = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token: it contains non-ASCII characters.") from None
        return self.authenticate_token(plaintext)

    def authenticate_token(self, plaintext: str) -> tuple[User, ApiToken]:
        token = selectors.token_by_digest(digest=token_digest(plaintext))
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This token has been revoked.")
        if token.is_expired(now):
            raise exceptions.AuthenticationFailed("This token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("This token's user is inactive.")
        if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'
