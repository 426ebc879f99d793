"""What the client raises: ``PlexRLError`` and its subclasses, one per kind of refusal."""

from __future__ import annotations


class PlexRLError(Exception):
    """Base class of every error the client raises."""


class ApiError(PlexRLError):
    """The server answered with an error status (a subclass names the common ones).

    ``status``: the HTTP status; ``errors``: the server's errors as ``{field: [message, ...]}``,
    nested fields dotted (``spec.steps``), messages without a field under ``detail``; ``url``: the
    URL asked. ``str()`` is one line: ``HTTP 400: spec.steps: must be a positive integer, got 0``.
    """

    def __init__(self, status: int, errors: dict[str, list[str]], url: str):
        self.status = status
        self.errors = errors
        self.url = url
        super().__init__(f"HTTP {status}: {one_line(errors) or 'no details'}")

    @property
    def client_error(self) -> bool:
        """A 4xx: the request was wrong (bad input, bad token, not found, a state that forbids it)."""
        return 400 <= self.status < 500


class BadRequest(ApiError):
    """400: the input is invalid; ``errors`` names each field."""


class Unauthorized(ApiError):
    """401: no token, or a token that is unknown, revoked or expired."""


class Forbidden(ApiError):
    """403: the token's role may not do this (or a quota forbids it)."""


class NotFound(ApiError):
    """404: no such object in the token's organization (another organization's objects included)."""


class Conflict(ApiError):
    """409: the object's state forbids it (cancelling a job that has ended, ...)."""


class PayloadTooLarge(ApiError):
    """413: the request is over a size limit (the message gives the limit)."""


class RateLimited(ApiError):
    """429: too many requests; try again later."""


class ServerError(ApiError):
    """5xx: the server failed; the request may be retried."""


_BY_STATUS: dict[int, type[ApiError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                          409: Conflict, 413: PayloadTooLarge, 429: RateLimited}


def api_error(status: int, errors: dict[str, list[str]], url: str) -> ApiError:
    """The ``ApiError`` subclass for ``status`` (``ApiError`` itself for one without its own)."""
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return kind(status, errors, url)


class Unreachable(PlexRLError):
    """No HTTP answer: the connection failed or timed out. ``url``: the URL asked."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach the platform at {url}: {reason}")


def flatten(errors: object, prefix: str = "") -> dict[str, list[str]]:
    """The server's error shapes (``{"detail": "..."}``, ``{"field": ["..."]}``, nested dicts,
    lists) as ``{dotted.field: [message, ...]}``; messages without a field go under ``detail``."""
    if isinstance(errors, dict):
        out: dict[str, list[str]] = {}
        for key, value in errors.items():
            name = "detail" if key in ("detail", "non_field_errors") and not prefix else (
                f"{prefix}.{key}" if prefix else str(key))
            for field, messages in flatten(value, name).items():
                out.setdefault(field, []).extend(messages)
        return out
    if isinstance(errors, list):
        out = {}
        for item in errors:
            for field, messages in flatten(item, prefix).items():
                out.setdefault(field, []).extend(messages)
        return out
    return {prefix or "detail": [str(errors)]}


def one_line(errors: dict[str, list[str]]) -> str:
    parts = []
    for field, messages in errors.items():
        text = " ".join(" ".join(m.split()) for m in messages)  # server messages may hold newlines
        parts.append(text if field == "detail" else f"{field}: {text}")
    return "; ".join(parts)
