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


def connect(path: str) -> socket.socket:
    """A connection to the socket at ``path``; ``Closed`` if nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise Closed(f"cannot reach {path}: {exc}") from exc
    return sock
