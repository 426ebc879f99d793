"""Requests to the real ASGI application (``config.asgi``), driven as a server drives it."""

from __future__ import annotations

from asgiref.testing import ApplicationCommunicator

from config.asgi import application

HOST = [(b"host", b"localhost")]


async def get(path_: str) -> dict:
    """GET ``path_`` from ``config.asgi``'s application: ``{"status", "headers", "body"}`` (the body
    of every ``http.response.body`` message; the last may carry none, which ASGI allows)."""
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path_, "raw_path": path_.encode(),
             "query_string": b"", "headers": HOST, "scheme": "http", "server": ("localhost", 80)}
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(5)
    assert start["type"] == "http.response.start"
    body = b""
    while True:
        message = await communicator.receive_output(5)
        assert message["type"] == "http.response.body"
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await communicator.wait(5)
    return {"status": start["status"], "headers": start["headers"], "body": body}
