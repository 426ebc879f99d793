"""Response headers Django's own middleware does not set: a Content-Security-Policy and a
Permissions-Policy on every response (``SecurityMiddleware`` adds nosniff, the referrer policy and
the cross-origin opener policy; ``XFrameOptionsMiddleware`` adds X-Frame-Options).

The policy (``settings.CONTENT_SECURITY_POLICY``) allows scripts only from this origin: the
dashboard is plain ES modules and a vendored chart library, with no inline script, and the API
docs page loads its start-up script from its own URL (drf-spectacular's split view). Styles may be
inline (the chart library and Swagger UI write style elements at run time); scripts may not.
A view that set its own header keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class SecurityHeadersMiddleware:
    """Synchronous only, and last in ``settings.MIDDLEWARE``, on purpose: under ASGI, Django then
    runs the whole middleware stack in one thread and hops back to the event loop once, at its
    inner end. Were the stack asynchronous, each of Django's own middleware (``MiddlewareMixin``)
    would run its request and response hooks in a thread hop each: some 15 hops a request, a
    large share of a small API request's CPU time."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        return response
