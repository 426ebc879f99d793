"""Websocket clients of the real ASGI application (``config.asgi``) for the websocket tests
(``test_websockets``, ``test_ws_isolation_fuzz``): the credentials a connection presents, running
jobs to connect to, and the ingest that pushes their live points.

Each test also needs the ``own_channel_layer`` fixture (conftest): its own prefix on the shared
Redis.
"""

from __future__ import annotations

from http.cookies import SimpleCookie
from typing import Any

from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.utils import timezone

from accounts import services as accounts_services
from accounts.models import ApiToken
from config.asgi import application
from jobs.ingest import ingest_events
from jobs.models import Job, JobState
from tests.platform.builders import SPEC

ORIGIN = (b"origin", b"http://localhost:8000")


def bearer(user, organization, **kwargs) -> tuple[bytes, bytes]:
    _, plaintext = accounts_services.token_create(user=user, organization=organization, name="ws", **kwargs)
    return b"authorization", f"Bearer {plaintext}".encode()


def token_header(user, organization, **kwargs) -> tuple[tuple[bytes, bytes], ApiToken]:
    token, plaintext = accounts_services.token_create(user=user, organization=organization, name="ws", **kwargs)
    return (b"authorization", f"Bearer {plaintext}".encode()), token


def session_cookie(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    cookie = SimpleCookie()
    cookie[django_settings.SESSION_COOKIE_NAME] = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    return b"cookie", cookie.output(header="", sep=";").strip().encode()


def make_job(tenant, name="run") -> Job:
    return Job.objects.create(organization=tenant.organization, created_by=tenant.member, name=name, spec=SPEC,
                              state=JobState.RUNNING, started_at=timezone.now())


def ingest(job: Job, events: list[dict[str, Any]]) -> int:
    return ingest_events(job=Job.objects.get(pk=job.pk), events=events)


async def connect(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, _ = await communicator.connect()
    assert connected
    return communicator
