"""The SDK's HTTP (``plexrl_client.transport``): one kept-alive connection per thread and server;
a connection the server closed while idle is replaced, and a request is never sent twice where
the server may have acted on it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from plexrl_client import BadRequest, ServiceClient, Unreachable
from plexrl_client.transport import send


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless told to close

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting: expected here
            self.close_connection = True

    def do_GET(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        server.requests.append(("GET", self.path, self.client_address[1]))
        if self.path.startswith("/api/v1/bad/"):
            self._answer(400, {"name": ["This field is required."]})
            return
        self._answer(200, {"path": self.path})
        if server.close_after_answer:
            self.close_connection = True  # closed while the client thinks it idle

    def do_POST(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append(("POST", self.path, self.client_address[1]))
        if server.drop_posts:  # acted on, then gone before answering
            self.close_connection = True
            self.connection.close()
            return
        if server.answer_after_s:  # a long poll: the server holds the request up to its "wait"
            time.sleep(server.answer_after_s)
            self._answer(200, {"seq": body["seq"], "state": "done", "result": {"ok": True}, "engine_ms": 1.0})
            server.late_answers.release()
            return
        self._answer(200, {"echo": body})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[tuple[str, str, int]]
    errors: int
    close_after_answer = False
    drop_posts = False
    answer_after_s = 0.0
    late_answers: threading.Semaphore

    def handle_error(self, request: object, client_address: object) -> None:
        # socketserver prints the traceback from the handler's thread; on CPython 3.11 printing one
        # parses source (traceback's caret anchors use ast.parse), which races with an ast.parse
        # on the main thread (a later test's) and fails there with "AST constructor recursion depth
        # mismatch". A test's server must not print from a thread left behind; the handlers above
        # catch what they expect, so anything else is a failure the test sees as no answer.
        self.errors += 1


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.requests = []
    srv.errors = 0
    srv.late_answers = threading.Semaphore(0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(server: _Server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_calls_from_one_thread_share_one_connection(server):
    for i in range(5):
        assert json.loads(send(_url(server, f"/a/{i}"))) == {"path": f"/a/{i}"}
    assert json.loads(send(_url(server, "/p"), method="POST", body={"x": 1})) == {"echo": {"x": 1}}
    assert len({port for _, _, port in server.requests}) == 1  # one client port: one TCP connection

    other: list[bytes] = []
    thread = threading.Thread(target=lambda: other.append(send(_url(server, "/b"))))
    thread.start()
    thread.join()
    assert len({port for _, _, port in server.requests}) == 2  # another thread, its own connection


def test_a_connection_the_server_closed_while_idle_is_replaced(server):
    server.close_after_answer = True
    for i in range(3):  # each answer closes the connection: the next request opens another
        assert json.loads(send(_url(server, f"/c/{i}"))) == {"path": f"/c/{i}"}
    time.sleep(0.2)  # idle: the server has closed the last one (a POST is not sent twice to find out)
    assert json.loads(send(_url(server, "/p"), method="POST", body={"n": 2})) == {"echo": {"n": 2}}
    assert [method for method, _, _ in server.requests] == ["GET", "GET", "GET", "POST"]  # each once
    assert len({port for _, _, port in server.requests}) == 4


def test_a_post_the_server_may_have_acted_on_is_not_sent_again(server):
    send(_url(server, "/warm"))  # a kept-alive connection to reuse
    server.drop_posts = True
    with pytest.raises(Unreachable, match=r"^cannot reach the platform at http://127\.0\.0\.1:\d+/p: "):
        send(_url(server, "/p"), method="POST", body={"once": True})
    assert [m for m, _, _ in server.requests].count("POST") == 1


def test_errors_keep_their_status_and_fields_and_a_closed_port_is_unreachable(server):
    client = ServiceClient(_url(server, ""), "token")
    with pytest.raises(BadRequest) as info:
        client._json("GET", "bad/")
    assert info.value.errors == {"name": ["This field is required."]}
    with pytest.raises(Unreachable, match="Connection refused"):
        send("http://127.0.0.1:9/api/v1/jobs/")


def test_a_session_call_waits_for_the_servers_long_poll_beyond_the_clients_timeout(server):
    """A blocking session call asks the server to hold the request up to ``WAIT_S`` for the answer;
    the client allows that on top of its own timeout (it used to give up at its timeout alone, so a
    call answered late in the server's wait failed as unreachable)."""
    from plexrl_client.session import WAIT_S, Session

    server.answer_after_s = 1.5
    client = ServiceClient(_url(server, ""), "token", timeout=1.0)
    session = Session(client, {"id": 7})
    started = time.monotonic()
    assert session._sync(session._call, "noop", {}) == {"ok": True}
    assert 1.5 <= time.monotonic() - started < 1.0 + WAIT_S
    with pytest.raises(Unreachable, match="no answer within 1 s"):  # any other request keeps the timeout
        client._json("POST", "sessions/7/calls/", body={"seq": 2})
    # the server's late answer to the request given up on is written (to a closed socket) before the
    # test ends: no handler thread outlives it
    for _ in range(2):  # the session call's answer, then the late one
        assert server.late_answers.acquire(timeout=5)
    assert server.errors == 0
