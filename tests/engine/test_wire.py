"""The node-socket framing the StateManager, the scheduler and a session's driver serve on
(``engine.support.wire``): ``Line``'s exchanges, one at a time a connection, several at once on
several; a caller that stops waiting drops its connection; a server that is gone is ``Closed``; a
failed call's error crosses as itself where it can."""

from __future__ import annotations

import contextlib
import pickle
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.support import wire


class Server:
    """Answers ``(delay, value)`` with ``value`` after ``delay`` seconds, a thread a connection."""

    def __init__(self, folder):
        self.listener, self.path = wire.listen_on_node(folder, "test")
        self.connections = 0
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self.open.append(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        with connection:
            while True:
                try:
                    delay, value = wire.recv(connection)
                except Exception:
                    return
                time.sleep(delay)
                try:
                    wire.send(connection, value)
                except OSError:
                    return

    def stop(self):
        """As a server process that dies: nothing listens, every connection is closed."""
        for sock in (self.listener, *self.open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def server(tmp_path):
    served = Server(tmp_path)
    yield served
    served.stop()


def test_exchanges_in_flight_at_once_each_have_a_connection_kept_for_the_next(server):
    line = wire.Line(server.path)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: line.answer(line.send((0.2, i))), range(4)))
    assert answers == [0, 1, 2, 3]
    assert server.connections == 4  # all four were in flight together
    assert [line.answer(line.send((0, i))) for i in range(10)] == list(range(10))
    assert server.connections == 4  # one after another, on the connections kept


def test_a_caller_that_stops_waiting_drops_its_connection_and_the_next_gets_a_new_one(server):
    line = wire.Line(server.path)
    slow = line.send((1.0, "late"))
    with pytest.raises(TimeoutError):
        line.answer(slow, timeout=0.1)
    assert slow.fileno() == -1  # closed: the late answer can never be taken for another's
    assert line.answer(line.send((0, "next"))) == "next"
    assert server.connections == 2


def test_a_server_that_is_gone_is_closed_for_new_exchanges_and_for_those_waiting(server):
    line = wire.Line(server.path)
    first, second = line.send((0, 1)), line.send((0, 1))
    assert [line.answer(first), line.answer(second)] == [1, 1]  # two connections kept
    waiting = line.send((0.5, 2))
    server.stop()
    with pytest.raises(wire.Closed):
        line.answer(waiting)
    with pytest.raises(wire.Closed):
        line.send((0, 3))  # the kept connection is broken, and nothing listens for a new one


def test_an_error_crosses_as_itself_else_as_its_cause_else_as_a_runtime_error_with_its_message():
    class Local(Exception):  # a class made at run time (as Ray's RayTaskError subclasses are) does not pickle
        pass

    plain = KeyError("k")
    assert wire.sendable_error(plain) is plain
    wrapped = Local("wrapped")
    wrapped.cause = ValueError("the cause")
    assert wire.sendable_error(wrapped) is wrapped.cause
    alone = wire.sendable_error(Local("no cause"))
    assert type(alone) is RuntimeError
    assert str(alone) == "Local: no cause"
    assert pickle.loads(pickle.dumps(alone)).args == alone.args  # noqa: S301 - our own bytes
