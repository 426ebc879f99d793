"""Per-job, append-only event log on disk (JSON lines with a monotonically increasing ``seq``).

Written by the job's driver; read by the CLI and the platform by cursor (``read(after_seq)``), so
a consumer that restarts loses nothing and, upserting by (job, seq), double-counts nothing.

The engine's supervisor also writes to a job's log: the ``failed`` state of a driver that died. A
driver that is being killed may still be running for a moment after its death was reported, so
writers take an exclusive ``flock`` for each append and first read what other writers appended:
``seq`` goes on after theirs, and once another writer ended the job (a terminal state) this one
appends nothing more (``LogEnded``), so no ``seq`` is used twice and nothing follows another
writer's end. A writer may follow its own end (a driver's summary after ``succeeded``).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class LogEnded(RuntimeError):
    """Another writer ended the job (wrote a terminal state) in this log."""


class EventLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._lock = threading.Lock()  # a driver's loop and the service's notes append from two threads
        with self._locked():
            _drop_torn_tail(self.path)  # else the next append would glue onto the torn line
            last = read_events(self.path)
            self.seq = last[-1]["seq"] if last else 0
            self._ended = any(_is_terminal(e) for e in last)  # ended by an earlier writer
            self._ended_here = False  # ended by this writer
            self._size = os.fstat(self._file.fileno()).st_size

    def _locked(self):
        return _FileLock(self._file.fileno())

    def append(self, kind: str, data: dict[str, Any], *, durable: bool = False, after_own_end: bool = True) -> int:
        """Append one event; ``durable`` fsyncs (used at every step boundary). ``LogEnded`` if
        another writer ended the job, or this one did and ``after_own_end`` is false (a pause or
        resume noted while the job's own loop was ending it)."""
        with self._lock, self._locked():
            fd = self._file.fileno()
            size = os.fstat(fd).st_size
            if size != self._size:  # another writer appended: go on after its events
                for event in _events_from(self.path, self._size):
                    self.seq = event["seq"]
                    self._ended = self._ended or _is_terminal(event)
                self._size = size
            if self._ended or (self._ended_here and not after_own_end):
                raise LogEnded(f"{self.path}: the job's log already ends; {kind} not written")
            self.seq += 1
            event = {"seq": self.seq, "kind": kind, "ts": time.time(), "data": data}
            line = (json.dumps(event) + "\n").encode()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
            self._ended_here = self._ended_here or _is_terminal(event)
            if durable:
                os.fsync(fd)
            return self.seq

    def close(self) -> None:
        self._file.close()


class _FileLock:
    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _is_terminal(event: dict[str, Any]) -> bool:
    return event["kind"] == "state" and event["data"].get("state") in TERMINAL_STATES


def _events_from(path: Path, offset: int) -> list[dict[str, Any]]:
    """The whole events written at or after byte ``offset``."""
    out = []
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                break
            out.append(json.loads(line))
    return out


def read_events(path: Path, after_seq: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """Events with ``seq > after_seq`` in order; a torn last line (crash mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn, even if what was written so far happens to parse
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            if event["seq"] > after_seq:
                out.append(event)
                if limit is not None and len(out) >= limit:
                    break
    return out


def has_ended(path: Path, tail: int = 64 << 10) -> bool:
    """Whether the log holds a terminal state. Reads its last ``tail`` bytes first (a job's end is
    among its last events: only its own writer's summary and artifact follow it), the whole log
    only where those hold none: cheap for the many logs of jobs that ended."""
    path = Path(path)
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail))
        lines = f.read().split(b"\n")
    for line in lines[1 if size > tail else 0:]:  # the first line of a tail may be cut
        if b'"state"' not in line:
            continue
        try:
            if _is_terminal(json.loads(line)):
                return True
        except ValueError:
            continue  # a torn last line
    return size > tail and any(_is_terminal(e) for e in read_events(path))


def _drop_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last whole line (one that ends in a newline and parses)."""
    if not path.exists():
        return
    valid = 0
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                json.loads(line)
            except ValueError:
                break
            valid += len(line)
    if valid < path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(valid)
