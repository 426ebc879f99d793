"""The ASGI request path: Django runs the middleware stack in one thread (``config.security``)."""

from __future__ import annotations

import logging

from django.core.handlers.asgi import ASGIHandler


def test_the_middleware_stack_runs_synchronously_in_one_thread_under_asgi(caplog, settings):
    """Django adapts a stack of mixed middleware at every switch between async and sync ones, and
    each ``MiddlewareMixin`` middleware running async hops to a thread for each of its hooks: with
    the stack async after WhiteNoise (sync only), an API request made some 15 thread hops. All sync,
    the stack is adapted once, at its inner end (to Django's async view runner). Django logs each
    adaptation when DEBUG is on."""
    settings.DEBUG = True
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        ASGIHandler().load_middleware(is_async=True)
    adapted = [r.getMessage() for r in caplog.records if "adapted for" in r.getMessage()]
    innermost = settings.MIDDLEWARE[-1]
    assert adapted
    assert set(adapted) == {f"Asynchronous handler adapted for middleware {innermost}."}
