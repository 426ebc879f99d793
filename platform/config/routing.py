"""Websocket routes (Channels), mounted by ``config.asgi``: ``/ws/jobs/<id>/`` and ``/ws/cluster/``
(``jobs.consumers``).

A browser's connection (it always sends ``Origin``) is checked against ALLOWED_HOSTS, so a page
of another site cannot open one with the user's cookie; a connection without ``Origin`` is a
program, let through to authenticate by token or ticket only (``accounts.websocket``). Then it is
authenticated once, then routed; a path of no route is closed with 4404."""

from channels.routing import URLRouter
from django.urls import path, re_path

from accounts.websocket import BrowserOriginValidator, WebsocketAuthMiddleware
from jobs import consumers

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/", consumers.JobConsumer.as_asgi()),
    path("ws/cluster/", consumers.ClusterConsumer.as_asgi()),
    re_path(r"", consumers.NoRouteConsumer.as_asgi()),  # last: every other path, closed with 4404
]

websocket_application = BrowserOriginValidator(WebsocketAuthMiddleware(URLRouter(websocket_urlpatterns)))
