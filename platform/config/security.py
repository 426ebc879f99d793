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

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin


class SecurityHeadersMiddleware(MiddlewareMixin):
    """Works in sync and async stacks (``MiddlewareMixin``): no thread hop under ASGI."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        return response
