"""A webhook endpoint for the tests: a real HTTP server on loopback, in a thread."""

from __future__ import annotations

import json
import threading
from collections import deque
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A webhook endpoint: records each request; answers the statuses queued, then 200."""

    def __init__(self):
        self.requests: list[tuple[Message, bytes]] = []
        self.statuses: deque[int] = deque()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.headers, body))  # looked up case-insensitively
                self.send_response(receiver.statuses.popleft() if receiver.statuses else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict]:
        return [json.loads(body) for _, body in self.requests]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
