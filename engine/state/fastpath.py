"""A swap's calls to the StateManager over a Unix socket on the node, beside its Ray actor.

A swap asks the manager twice (``plan_read`` then ``done_read``, or ``reserve`` then ``commit``)
and each Ray actor call costs a millisecond or more on a small node, as much as copying 10 MB. The
manager therefore also answers the calls on a swap's path over a Unix socket: one thread per
connection, length-prefixed pickles, the same methods as the actor (so the same arguments and the
same store, under its lock). A call may also be sent unanswered (``Connections.send``: a read's
release, which has nothing to report); the connection's later calls are served after it. The
actor stays the manager's identity and lifecycle: ranks find it by name, learn the socket's path
from it (``endpoint``), and fall back to it whenever the socket fails (a restarted manager has a
new socket).

Only processes of the node's user can connect: the socket is created mode 0600 in the host tier's
per-user folder. Pickle is what Ray's own calls carry between these same processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Collection
from typing import Any

from engine.support.wire import Closed, connect, listen_private, recv, send

_log = logging.getLogger(__name__)

#: the StateManager's calls on a swap's path, served over its node socket too
FAST_METHODS = frozenset({"plan_read", "done_read", "reserve", "commit", "abort", "record", "set_resident"})


class Server:
    """Serves ``methods`` of ``target`` on a Unix socket at ``path`` (daemon threads)."""

    def __init__(self, path: str, target: Any, methods: Collection[str]):
        self.path, self.target, self.methods = path, target, frozenset(methods)
        self.served = 0  # calls answered (tests and benchmarks see the socket is used)
        self._sock = listen_private(path)
        threading.Thread(target=self._accept, name="state-fastpath", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="state-fastpath-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    method, args, answer = recv(conn)
                except (Closed, OSError):
                    return
                try:
                    if method not in self.methods:
                        raise AttributeError(f"the StateManager's socket does not serve {method!r}")
                    reply = (True, getattr(self.target, method)(*args))
                except Exception as exc:  # the caller re-raises it
                    reply = (False, exc)
                self.served += 1
                if not answer:
                    if not reply[0]:
                        _log.warning("unanswered %s failed: %s", method, reply[1])
                    continue
                try:
                    send(conn, reply)
                except OSError:
                    return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Connections:
    """A client's connections to one manager's socket: one per thread (a rank's prefetch thread
    and its main thread call concurrently). ``endpoint()`` gives the socket's path (asking the
    actor); ``reset()`` forgets it, after a failure or when the manager was replaced."""

    def __init__(self, endpoint: Callable[[], str | None]):
        self._endpoint_of = endpoint
        self._endpoint: str | None = None
        self._known = False
        self._local = threading.local()

    def reset(self) -> None:
        self._known = False
        self._endpoint = None

    @property
    def available(self) -> bool:
        """False once the manager said it serves no socket (until ``reset``)."""
        return not self._known or self._endpoint is not None

    def call(self, method: str, args: tuple) -> Any:
        """The method's answer; raises what it raised, or ``Closed`` when the socket failed (the
        call may or may not have run) or there is none."""
        sock = self._connection()
        try:
            send(sock, (method, args, True))
            ok, value = recv(sock)
        except (Closed, OSError) as exc:
            self._broken(sock)
            raise Closed(str(exc)) from exc
        if not ok:
            raise value
        return value

    def send(self, method: str, args: tuple) -> None:
        """Send the call unanswered (the manager logs its failure); ``Closed`` as for ``call``."""
        sock = self._connection()
        try:
            send(sock, (method, args, False))
        except OSError as exc:
            self._broken(sock)
            raise Closed(str(exc)) from exc

    @property
    def known(self) -> bool:
        """Whether the manager was asked for its socket (since the last ``reset``)."""
        return self._known

    def locate(self) -> None:
        """Ask the actor for the socket's path now, unless known (which waits for a manager that
        is starting); each thread connects on its first call."""
        if not self._known:
            self._endpoint, self._known = self._endpoint_of(), True

    def _broken(self, sock: socket.socket) -> None:
        sock.close()
        self._local.sock = None

    def _connection(self) -> socket.socket:
        """This thread's connection to the socket, opened if need be."""
        self.locate()
        path = self._endpoint
        if path is None:
            raise Closed("the StateManager serves no socket")
        sock = getattr(self._local, "sock", None)
        if sock is None or self._local.path != path:
            if sock is not None:
                sock.close()
            self._local.sock = None
            sock = connect(path)
            self._local.sock, self._local.path = sock, path
        return sock
