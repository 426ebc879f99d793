"""Per-job, append-only event log on disk (JSON lines with a monotonically increasing ``seq``).

Written by the job's driver; read by the CLI and the platform by cursor (``read(after_seq)``), so
a consumer that restarts loses nothing and, upserting by (job, seq), double-counts nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)  # else the next append would glue onto the torn line
        last = read_events(self.path)
        self.seq = last[-1]["seq"] if last else 0
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # a driver's loop and the service's notes append from two threads

    def append(self, kind: str, data: dict[str, Any], *, durable: bool = False) -> int:
        """Append one event; ``durable`` fsyncs (used at every step boundary)."""
        with self._lock:
            self.seq += 1
            line = json.dumps({"seq": self.seq, "kind": kind, "ts": time.time(), "data": data})
            self._file.write(line + "\n")
            self._file.flush()
            if durable:
                os.fsync(self._file.fileno())
            return self.seq

    def close(self) -> None:
        self._file.close()


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
