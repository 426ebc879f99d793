"""HTTP for the client, standard library only: one keep-alive connection per thread and server, so
that a loop's calls do not each pay a new TCP connection (and the server's setup of one).

A connection the server closed while idle (servers close idle keep-alive connections after a few
seconds) is noticed before it is used and replaced. A request whose sending fails on a reused
connection is sent once more on a new one (the server got no whole request); one that fails
after it was sent is not, unless it is a GET none of whose answer was kept yet: a POST may have
been acted on.
"""

from __future__ import annotations

import http.client
import json
import select
import shutil
import threading
import urllib.parse
import uuid
from typing import Any, BinaryIO

from plexrl_client.errors import Unreachable, api_error, flatten

_local = threading.local()  # .pool: {(scheme, host:port): HTTPConnection} of this thread


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the server: it has something to read (the close)."""
    if connection.sock is None:
        return False
    try:
        readable, _, _ = select.select([connection.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _connection(scheme: str, netloc: str, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
    """This thread's connection to ``netloc``, and whether it was used before."""
    pool: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("pool", {})
    connection = pool.get((scheme, netloc))
    if connection is not None and _dropped(connection):
        connection.close()
    reused = connection is not None and connection.sock is not None
    if connection is None:
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        connection = pool[(scheme, netloc)] = kind(netloc, timeout=timeout)
    connection.timeout = timeout
    if connection.sock is not None:
        connection.sock.settimeout(timeout)
    return connection, reused


def _exchange(connection: http.client.HTTPConnection, method: str, path: str, data: bytes | None,
              headers: dict[str, str], *, retry: bool, into: BinaryIO | None = None) -> tuple[int, bytes] | None:
    """One request and its answer (status, body; a successful body copied ``into`` a file instead,
    a megabyte at a time); None where it should be sent again."""
    try:
        connection.request(method, path, body=data, headers=headers)
    except (ConnectionError, http.client.HTTPException):
        connection.close()
        if retry:
            return None
        raise
    try:
        response = connection.getresponse()
        if into is not None and response.status < 400:
            shutil.copyfileobj(response, into, 1 << 20)
            return response.status, b""
        return response.status, response.read()
    except (http.client.RemoteDisconnected, ConnectionResetError):
        connection.close()
        if retry and method == "GET" and (into is None or into.tell() == 0):  # nothing of it kept yet
            return None
        raise
    except BaseException:
        connection.close()
        raise


def multipart(fields: dict[str, str],
              files: dict[str, tuple[str, bytes]] | list[tuple[str, tuple[str, bytes]]]) -> tuple[str, bytes]:
    """A ``multipart/form-data`` body (RFC 7578) of text ``fields`` and ``files`` (name -> (file
    name, bytes), or (name, (file name, bytes)) pairs, a name repeated for several files): its
    Content-Type and its bytes, for ``send(body=..., content_type=...)``."""
    boundary = f"plexrl-{uuid.uuid4().hex}"  # random: no file holds it by chance
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields.items()]
    for name, (filename, data) in files.items() if isinstance(files, dict) else files:
        quoted = filename.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")  # as browsers send it
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{quoted}"\r\n'
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", b"".join(parts)


def send(url: str, *, method: str = "GET", body: Any = None, token: str | None = None,
         accept: str = "application/json", timeout: float = 30.0, content_type: str | None = None,
         into: BinaryIO | None = None) -> bytes:
    """The body of the answer to one request; ``ApiError`` for an error status, ``Unreachable``
    (naming the URL without its query) when no answer came. ``body`` is sent as JSON, or as it is
    (bytes) with ``content_type``; with ``into`` (a file), a successful answer's body is written
    there as it comes and b"" returned."""
    where = url.split("?")[0]
    if not url.startswith(("http://", "https://")):
        raise Unreachable(where, "the URL must start with http:// or https://")
    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Accept": accept, "User-Agent": "plexrl-client"}
    data = None
    if content_type is not None:
        data, headers["Content-Type"] = body, content_type
    elif body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        while True:
            connection, reused = _connection(parts.scheme, parts.netloc, timeout)
            answer = _exchange(connection, method, path, data, headers, retry=reused, into=into)
            if answer is not None:
                break
    except TimeoutError:
        raise Unreachable(where, f"no answer within {timeout:g} s") from None
    except OSError as exc:  # refused, unknown host, reset
        raise Unreachable(where, exc.strerror or str(exc) or type(exc).__name__) from None
    except http.client.HTTPException as exc:  # a malformed or cut answer
        raise Unreachable(where, str(exc) or type(exc).__name__) from None
    status, raw = answer
    if status >= 400:
        try:
            errors = flatten(json.loads(raw))
        except ValueError:  # not JSON: a proxy's page, a server crash without DEBUG
            text = " ".join(raw.decode(errors="replace").split())[:200]
            errors = {"detail": [text or http.client.responses.get(status, "no details")]}
        raise api_error(status, errors, url)
    return raw
