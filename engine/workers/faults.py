"""Fail points: make a real engine process die (or one of its threads fail) at a chosen moment,
to test recovery.

A fault is armed by writing ``<data dir>/faults/<site>.json`` (``arm``): the process that reaches
``site`` with matching context for the ``nth`` time deletes the file (so the process that replaces
it does not die too) and then, by the fault's ``action``:

- ``kill`` (the default): kills itself with SIGKILL: no handler, no clean-up, as an out-of-memory
  kill or a lost node would end it;
- ``raise``: raises ``InjectedFault`` there, an error the code around the site did not expect (a
  Ray call that timed out, a bug), which that code must survive.

Sites:

- ``rank``: a worker rank, as it starts executing a call (context: job, fn, wpg, rank).
- ``watch``: the engine service's watch (it notices drivers that end and admits waiting jobs),
  at the start of each pass (no context).

(Processes that can be killed at any moment to the same effect, a job's driver or the scheduler,
need no fail point: tests ``ray.kill`` them.)

When nothing is armed a site costs one ``stat`` of a missing file.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

SITES = ("rank", "watch")
ACTIONS = ("kill", "raise")
_lock = threading.Lock()
_seen: dict[tuple[Path, str], int] = {}  # matching passes so far, per armed file and process


class InjectedFault(RuntimeError):
    """What a fault armed with ``action="raise"`` raises at its site."""


def fault_path(data_dir: Path | str, site: str) -> Path:
    if site not in SITES:
        raise ValueError(f"unknown fail point {site!r}; known: {', '.join(SITES)}")
    return Path(data_dir) / "faults" / f"{site}.json"


def arm(data_dir: Path | str, site: str, *, nth: int = 1, action: str = "kill", **match: Any) -> Path:
    """Kill the process that passes ``site`` with context matching ``match`` for the ``nth`` time (or,
    with ``action="raise"``, raise ``InjectedFault`` there)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown fault action {action!r}; known: {', '.join(ACTIONS)}")
    path = fault_path(data_dir, site)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"nth": nth, "match": match, "action": action, "armed": os.urandom(8).hex()}))
    tmp.rename(path)  # whole or absent, never half-written, for a process reading it now
    return path


def disarm(data_dir: Path | str, site: str) -> None:
    fault_path(data_dir, site).unlink(missing_ok=True)


def tripped(data_dir: Path | str, site: str) -> bool:
    """Whether an armed fault went off (its file is gone)."""
    return not fault_path(data_dir, site).exists()


def check(data_dir: Path | str | None, site: str, **context: Any) -> None:
    """Die here (or raise ``InjectedFault``) if a fault armed for ``site`` matches ``context`` and this
    is its nth pass."""
    if data_dir is None:
        return
    path = fault_path(data_dir, site)
    try:
        armed = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return
    if any(context.get(k) != v for k, v in armed["match"].items()):
        return
    with _lock:
        key = (path, armed["armed"])
        _seen[key] = _seen.get(key, 0) + 1
        if _seen[key] < armed["nth"]:
            return
    try:
        path.unlink()
    except FileNotFoundError:
        return  # another process took it
    if armed.get("action") == "raise":
        raise InjectedFault(f"fail point {site!r} (armed to raise)")
    os.kill(os.getpid(), signal.SIGKILL)
