"""The ASGI request path: the middleware stack is synchronous (``config.security``), and
``config.asgi`` serves each HTTP request in one hop to a worker thread (``config.http``)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from asgiref.sync import SyncToAsync
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.http import StreamingHttpResponse
from django.urls import path

import config.urls
from config.http import OneHopASGIHandler
from tests.platform.asgi_client import get


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


# --- the HTTP handler of config.asgi: one worker-thread hop a request ------------------------------


def _streamed(request):
    return StreamingHttpResponse(iter([b"a" * 70_000, b"b" * 10]), content_type="application/octet-stream")


def _broken(request):
    raise RuntimeError("s3cr3t detail")


urlpatterns = [path("streamed", _streamed), path("broken", _broken), *config.urls.urlpatterns]


@pytest.fixture
def thread_log():
    """``[(signal, thread id)]`` of request_started and request_finished while the test runs."""
    log = []

    def started(**kwargs):
        log.append(("started", threading.get_ident()))

    def finished(**kwargs):
        log.append(("finished", threading.get_ident()))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield log
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def test_the_http_handler_loads_the_stack_synchronously_without_adapting_it(caplog, settings):
    settings.DEBUG = True
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        OneHopASGIHandler()
    assert not [r.getMessage() for r in caplog.records if "adapted for" in r.getMessage()]


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """The names of the functions sent from the event loop to a thread (``sync_to_async``)."""
    sent = []
    call = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        sent.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return sent


@pytest.mark.asyncio
async def test_a_request_runs_start_to_finish_in_one_hop_to_a_worker_thread(thread_log, hops):
    """Django's own handler makes five hops for this request, among them the started signal, the
    middleware chain and the response's close."""
    response = await get("/healthz")
    assert (response["status"], json.loads(response["body"])) == (200, {"status": "ok"})
    assert hops == ["OneHopASGIHandler._respond"]
    assert [name for name, _ in thread_log] == ["started", "finished"]
    (_, first), (_, last) = thread_log
    assert first == last != threading.get_ident()  # off the event loop's thread


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")  # Django's, as ever
async def test_a_streaming_response_is_sent_whole_then_closed(thread_log, settings):
    settings.ROOT_URLCONF = __name__
    response = await get("/streamed")
    assert response["status"] == 200
    assert response["body"] == b"a" * 70_000 + b"b" * 10
    assert [name for name, _ in thread_log] == ["started", "finished"]


@pytest.mark.asyncio
async def test_an_unhandled_error_is_a_plain_500_without_its_details(settings):
    settings.ROOT_URLCONF = __name__
    settings.DEBUG = False
    response = await get("/broken")
    assert response["status"] == 500
    assert b"s3cr3t" not in response["body"]
