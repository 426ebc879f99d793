"""Length-prefixed pickles over a node-local Unix socket: the framing that the StateManager's and
the scheduler's sockets share (they serve callers on their node beside their Ray actors, whose
calls cost a millisecond or more each on a small node).

Only processes of the node's user can connect: ``listen_private`` creates the socket mode 0600.
Pickle is what Ray's own calls carry between these same processes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import threading
from pathlib import Path
from typing import Any

HEADER = struct.Struct("<Q")


class Closed(ConnectionError):
    """The connection broke (the server died, or restarted with a new socket)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise Closed("the server closed the connection")
        got += k
    return bytes(buf)


def frame(obj: Any) -> bytes:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


def send(sock: socket.socket, obj: Any) -> None:
    sock.sendall(frame(obj))


def recv(sock: socket.socket) -> Any:
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return pickle.loads(_recv_exact(sock, n))  # noqa: S301 - a 0600 socket of this user (module doc)


async def read_frame(reader) -> Any:
    """The next object from an ``asyncio.StreamReader``; ``asyncio.IncompleteReadError`` at its end."""
    (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(n))  # noqa: S301 - a 0600 socket of this user (module doc)


def listen_private(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (replacing a stale one) that only this user can reach.
    Raises OSError, e.g. for a path longer than the 107 bytes a Unix socket may have."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: no window in which another user could connect
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


def listen_on_node(folder: Path, kind: str) -> tuple[socket.socket, str]:
    """A private listening socket of this process in ``folder`` (this user's folder on the node),
    named ``{kind}-{pid}.sock``, and its path; the sockets of ``kind`` whose process is gone (killed
    before it could remove its own) are removed first. Raises OSError (e.g. a path too long)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f"{kind}-*.sock"):
        try:
            os.kill(int(stale.stem.removeprefix(f"{kind}-")), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except (ValueError, PermissionError):
            continue
    path = str(folder / f"{kind}-{os.getpid()}.sock")
    return listen_private(path), path


def sendable_error(exc: BaseException) -> Exception:
    """``exc`` as a failed call's answer carries it: itself where it pickles (a rank's error comes
    as Ray's ``RayTaskError`` subclass of it, made at run time, which does not), else its cause, or
    a ``RuntimeError`` with its class and message."""
    for error in (exc, getattr(exc, "cause", None)):
        if isinstance(error, Exception):
            with contextlib.suppress(Exception):
                pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
                return error
    return RuntimeError(f"{type(exc).__name__}: {exc}")


def connect(path: str) -> socket.socket:
    """A connection to the socket at ``path``; ``Closed`` if nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise Closed(f"cannot reach {path}: {exc}") from exc
    return sock


class Line:
    """Request-and-answer exchanges with the server of a node socket, one at a time on each of its
    connections: ``send`` puts a request on a connection of its own (an idle one, else a new one),
    ``answer`` reads that connection's answer and keeps it for the next request. So several
    exchanges may be in flight at once, from any threads, each on its connection."""

    def __init__(self, path: str):
        self.path = path
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def send(self, request: Any) -> socket.socket:
        """The connection ``request`` went out on; ``Closed`` (nothing was sent) when the server
        cannot be reached. A kept connection that broke meanwhile is replaced once."""
        data = frame(request)
        with self._lock:
            kept = self._idle.pop() if self._idle else None
        if kept is not None:
            try:
                kept.sendall(data)
                return kept
            except OSError:
                kept.close()
        sock = connect(self.path)
        try:
            sock.sendall(data)
        except OSError as exc:
            sock.close()
            raise Closed(f"cannot send to {self.path}: {exc}") from exc
        return sock

    def answer(self, sock: socket.socket, timeout: float | None = None) -> Any:
        """The answer on ``sock`` (``send``'s connection). TimeoutError: none within ``timeout``
        seconds (the connection is dropped: its answer may still come); ``Closed``: the
        connection broke first."""
        sock.settimeout(timeout)
        try:
            answer = recv(sock)
        except TimeoutError:
            sock.close()
            raise
        except Exception as exc:  # broken, or an answer that did not unpickle: the connection is done
            sock.close()
            raise Closed(f"the connection to {self.path} broke: {exc}") from exc
        sock.settimeout(None)
        with self._lock:
            self._idle.append(sock)
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
