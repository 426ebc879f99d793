"""Per-job, append-only event log on disk (JSON lines with a monotonically increasing ``seq``).

Written by the job's driver; read by the CLI and the platform by cursor (``read(after_seq)``), so
a consumer that restarts loses nothing and, upserting by (job, seq), double-counts nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        last = read_events(self.path)
        self.seq = last[-1]["seq"] if last else 0
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, kind: str, data: dict[str, Any], *, durable: bool = False) -> int:
        """Append one event; ``durable`` fsyncs (used at every step boundary)."""
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
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            if event["seq"] > after_seq:
                out.append(event)
                if limit is not None and len(out) >= limit:
                    break
    return out
