"""The engine's service API: what the platform calls, and nothing Ray-shaped.

``EngineClient`` is the only engine object the platform (its Celery tasks) holds:

    client = EngineClient()                 # joins RAY_ADDRESS, or starts a local Ray
    client.submit_job("job-42", spec)       # idempotent by job id: a redelivered task starts nothing
    client.set_tenant("org-7", weight=2.0, device_seconds=3600.0)  # fair share and budget
    client.events("job-42", after_seq=17)   # the job's event log, by cursor
    client.pause("job-42"); client.resume("job-42"); client.cancel("job-42", reason="...")
    client.status("job-42"); client.cluster_snapshot(); client.estimate(spec)

Behind it runs the controller (``engine.service.controller``). Importing this module loads no Ray
and no torch: a web or Celery process pays for Ray only when it first talks to the engine.

This module is the platform's one door into the engine, with ``engine.spec`` (the job spec),
``engine.errors`` and ``engine.paths`` (an import-linter contract holds the Django apps to these).
Besides the client it names the pure pieces the control plane computes with itself: the pre-run
estimate and the metering that billing stores (one implementation, shared with the simulator),
the model catalog, the check an uploaded model folder passes, and the dataset check an upload runs
(the same one a job's start runs).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.accounting.estimate import estimate
from engine.accounting.metering import LedgerTotals, ledger_totals, record_rows, savings_of_rows, savings_of_totals
from engine.errors import SessionClosed, SessionPending, UnknownJob, UnknownService
from engine.models import PRESETS, build_presets, is_model_dir, preset_dir, resolve_model
from engine.models.check import BACKEND_ARCHITECTURES, check_model_folder, configuration_problem
from engine.models.check import file_problem as model_file_problem
from engine.paths import plexrl_home
from engine.scheduler.core import Policy
from engine.service.session_calls import SESSION_CALLS
from engine.spec import JobSpec, ServiceConfig, check_job_id, priority_factor
from engine.support.wire import Closed, Line
from engine.tasks.datasets import FIELDS as DATASET_FIELDS
from engine.tasks.datasets import FORMATS as DATASET_FORMATS
from engine.tasks.datasets import MAX_BYTES as MAX_DATASET_BYTES
from engine.tasks.datasets import format_of, parse_dataset, to_jsonl

__all__ = [  # what the control plane uses, besides EngineClient
    "BACKEND_ARCHITECTURES",
    "DATASET_FIELDS",
    "DATASET_FORMATS",
    "MAX_DATASET_BYTES",
    "PRESETS",
    "PROFILE_STEPS",
    "SESSION_CALLS",
    "EngineClient",
    "LedgerTotals",
    "ServiceConfig",
    "build_presets",
    "check_model_folder",
    "configuration_problem",
    "estimate",
    "format_of",
    "is_model_dir",
    "ledger_totals",
    "model_file_problem",
    "parse_dataset",
    "preset_dir",
    "record_rows",
    "resolve_model",
    "savings_of_rows",
    "savings_of_totals",
    "to_jsonl",
]

SERVICE_NAME = "plexrl-engine"
PROFILE_STEPS = Policy().profile_steps  # steps a new job runs before the scheduler places it


RESTART_WAIT_S = 60.0  # the most a client waits for a dead service's successor to answer


class EngineClient:
    """The platform's handle on the engine; every method is one short remote call."""

    def __init__(self, *, address: str | None = None, data_dir: Path | None = None,
                 config: ServiceConfig | None = None, timeout_s: float = 120.0, create: bool = True):
        """Join ``address`` (or RAY_ADDRESS; without either, start a local Ray) and the engine
        service there, starting it if ``create``; with ``create=False`` a cluster without the
        service raises ``UnknownService``."""
        import ray

        from engine.service.runtime import EngineConfig, start_ray

        address = address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            if address:
                # quiet: a CLI command's output is its answer (or its one-line error)
                ray.init(address=address, namespace="plexrl", log_to_driver=False, logging_level=logging.WARNING)
            else:
                start_ray(EngineConfig())
        self.data_dir = Path(data_dir) if data_dir else plexrl_home()
        self.timeout_s = timeout_s
        self.config = config or ServiceConfig()
        self.create = create
        self._sessions: dict[str, Any] = {}  # session -> its driver, as the service named it
        self._session_lines: dict[str, Line | None] = {}  # session -> its driver's node socket, if reachable
        if not create:
            try:
                self.actor = ray.get_actor(SERVICE_NAME, namespace="plexrl")
            except ValueError:
                raise UnknownService(f"no engine service runs on the cluster at {address}") from None
            return
        self.actor = self._service()

    def _service(self) -> Any:
        """The engine service, started if none runs: on this process's node (the platform's, e.g.
        a Ray cluster's head), never on a worker node whose loss would take the controller, the
        scheduler and the drivers with it. A service started after one died rebuilds its jobs from
        their event logs (``EngineService``)."""
        from engine.service.controller import EngineService
        from engine.support.local_node import here

        return EngineService.options(name=SERVICE_NAME, lifetime="detached", get_if_exists=True,
                                     scheduling_strategy=here()).remote(str(self.data_dir), asdict(self.config))

    def _call(self, method: str, *args: Any) -> Any:
        """One remote call. Where the service died (killed, out of memory, its node lost), a client
        that may start it (``create``) starts another and asks that once more: every method is
        safe to repeat (a job is submitted once by id)."""
        import ray

        deadline = None  # set once the service is found dead
        while True:
            try:
                return ray.get(getattr(self.actor, method).remote(*args), timeout=self.timeout_s)
            except ray.exceptions.RayTaskError as exc:
                raise exc.as_instanceof_cause() from None
            except ray.exceptions.RayActorError:
                if not self.create or (deadline is not None and time.monotonic() > deadline):
                    raise
                if deadline is None:
                    deadline = time.monotonic() + RESTART_WAIT_S
                else:  # the dead service's name is released once Ray has seen it die
                    time.sleep(0.5)
            self.actor = self._service()

    def submit_job(self, job_id: str, spec: JobSpec | dict[str, Any], *, tenant: str = "",
                   priority: str = "normal") -> dict[str, Any]:
        """Validated here first (SpecError naming the field, ValueError for the id or an unknown
        priority): bad input never reaches the engine. ``tenant``: whose weight and budget
        (``set_tenant``) the job's calls get and spend; ``priority``: a name in
        ``engine.spec.PRIORITIES``, which orders the job's calls within its tenant's share."""
        parsed = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
        priority_factor(priority)
        return self._call("submit_job", check_job_id(job_id), parsed.to_dict(), tenant, priority)

    def set_tenant(self, tenant: str, *, weight: float, device_seconds: float | None) -> float | None:
        """``tenant``'s weight (its share of contended worker groups is in proportion to it) and
        the device-seconds its jobs may still use from now on (None: no limit), in one step; the
        engine keeps both across a scheduler restart (the budget less what was used since).
        Returns the budget left before (None: no limit), as ``set_budget`` does."""
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a tenant weight must be a finite number > 0, got {weight!r}")
        _check_budget(device_seconds)
        return self._call("set_tenant", tenant, value, device_seconds)

    def set_budget(self, tenant: str, device_seconds: float | None) -> float | None:
        """From now on ``tenant``'s jobs may use ``device_seconds`` more (None: no limit). Their
        calls past it wait, queued, and run when it is raised; the overrun is at most the calls
        running when it ran out. Returns what was left before."""
        _check_budget(device_seconds)
        return self._call("set_budget", tenant, device_seconds)

    def budget_left(self, tenant: str) -> float | None:
        """Device-seconds ``tenant`` may still use (below zero: the overrun); None without a budget."""
        return self._call("budget_left", tenant)

    def status(self, job_id: str) -> dict[str, Any]:
        return self._call("status", job_id)

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        return self._call("events", job_id, after_seq, limit)

    def pause(self, job_id: str) -> dict[str, Any]:
        return self._call("pause", job_id)

    # -- sessions: a job whose loop is the tenant's (JobSpec(algorithm="session")) ----------------
    def session_submit(self, job_id: str, seq: int, fn: str, args: dict[str, Any], *,
                       wait_s: float | None = None) -> SessionCall:
        """Send call number ``seq`` (from 1, each once; ``engine.service.session``) of session
        ``job_id``: ``fn`` with its JSON ``args``. Returns at once, the call being queued; its
        ``result()`` is the JSON result. Waits up to ``wait_s`` (None: ``timeout_s``) for a session
        still queued for groups, then raises SessionPending (nothing was sent). SessionClosed: it
        has ended; ValueError: it is not a session."""

        return self._session_exchange(job_id, seq, "call", (seq, fn, args), wait_s)

    def _session_exchange(self, job_id: str, seq: int, method: str, args: tuple, wait_s: float | None) -> SessionCall:
        """``method`` (``call`` or ``result``) of the session's driver, on its node socket where
        this process is on the driver's node (``SessionDriver.endpoint``), else through the actor."""
        driver = self._sessions.get(job_id) or self._session_driver(job_id, wait_s)
        line = self._session_lines.get(job_id)
        if line is not None:
            try:
                return SessionCall(self, job_id, seq, line=line, sock=line.send((method, args)))
            except Closed:  # the socket is gone: the actor from now on
                self._session_lines[job_id] = None
        return SessionCall(self, job_id, seq, ref=getattr(driver, method).remote(*args))

    def _session_driver(self, job_id: str, wait_s: float | None) -> Any:
        """The session's driver, once the service has it: a session not submitted yet (its launch
        is on its way) or queued for groups is waited for up to ``wait_s``, then SessionPending."""
        deadline = time.monotonic() + (self.timeout_s if wait_s is None else wait_s)
        while True:
            try:
                driver = self._call("session", job_id)
            except UnknownJob:
                driver = None
            if driver is not None:
                self._session_lines[job_id] = _session_line(driver, self.timeout_s)
                self._sessions[job_id] = driver
                return driver
            if time.monotonic() > deadline:
                raise SessionPending(f"session {job_id} is not placed yet: send the call again")
            time.sleep(0.2)

    def session_loop(self, job_id: str, model: str) -> Any:
        """A ``RemoteClient`` (the function API's ``Client``) whose calls go to session ``job_id``
        (opened on ``model``), numbered from 1 in the order the loop makes them."""
        import itertools

        from engine.service.remote_loop import RemoteClient

        numbers = itertools.count(1)
        return RemoteClient(lambda fn, args: self.session_submit(job_id, next(numbers), fn, args), model)

    def session_result(self, job_id: str, seq: int, wait_s: float) -> dict[str, Any]:
        """The answer of call ``seq`` of session ``job_id``, sent before (``SessionCall.answer``),
        or the error it raised. TimeoutError: not there within ``wait_s``; LookupError: no longer kept;
        SessionPending: the session is still queued for groups."""

        return self._session_exchange(job_id, seq, "result", (seq, wait_s), 0.0).answer()

    def session_call(self, job_id: str, seq: int, fn: str, args: dict[str, Any], *,
                     wait_s: float | None = None) -> dict[str, Any]:
        """``session_submit(...).result()``: the call's JSON result once it has run."""
        return self.session_submit(job_id, seq, fn, args, wait_s=wait_s).result(wait_s)

    def resume(self, job_id: str) -> dict[str, Any]:
        return self._call("resume", job_id)

    def cancel(self, job_id: str, reason: str = "") -> dict[str, Any]:
        return self._call("cancel", job_id, reason)

    def cluster_snapshot(self) -> dict[str, Any]:
        return self._call("cluster_snapshot")

    def drain(self, node: str, *, undo: bool = False) -> dict[str, Any]:
        """Take ``node`` (an id, or a prefix of one) out of placement, moving its jobs elsewhere
        (``EngineService.drain``); ``undo``: place groups there again. ValueError: no such node."""
        return self._call("drain", node, undo)

    def estimate(self, spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
        return self._call("estimate", spec.to_dict() if isinstance(spec, JobSpec) else spec)

    def shutdown(self) -> None:
        """Stop every job and the service's groups, and the service itself."""
        import ray

        self._call("shutdown")
        ray.kill(self.actor)


class SessionCall:
    """A session call on its way (``EngineClient.session_submit``); ``result()`` waits for it. It
    went to the session's driver through the actor (``ref``), or on its node socket (``line``,
    ``sock``)."""

    def __init__(self, client: EngineClient, job_id: str, seq: int, *, ref: Any = None, line: Line | None = None,
                 sock: Any = None):
        self._client, self._job, self._seq = client, job_id, seq
        self._ref, self._line, self._sock = ref, line, sock

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """The call's JSON result."""
        return self.answer(timeout)["result"]

    def answer(self, timeout: float | None = None) -> dict[str, Any]:
        """``result`` and ``engine_ms``, what the call took in the engine (``SessionDriver.call``).
        TimeoutError: not within ``timeout`` seconds (the call goes on; ask again)."""
        import ray

        if self._sock is not None:
            sock, self._sock = self._sock, None
            try:
                ok, value = self._line.answer(sock, timeout)
            except TimeoutError:
                raise TimeoutError(f"session {self._job}: no answer within {timeout} s yet") from None
            except Closed:  # the driver has the call's answer, or is gone: the actor says which
                self._client._session_lines[self._job] = None
            else:
                if ok:
                    return value
                raise value
        if self._ref is None:  # its socket exchange is over: the driver keeps the answer for ``result``
            wait = self._client.timeout_s if timeout is None else timeout
            fetch = self._client._session_exchange(self._job, self._seq, "result", (self._seq, wait), 0.0)
            return fetch.answer(timeout)
        try:
            return ray.get(self._ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"session {self._job}: no answer within {timeout} s yet") from None
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None
        except ray.exceptions.RayActorError:  # its driver is gone: the session ended meanwhile
            raise self._closed(self._client.status(self._job)) from None

    def _closed(self, status: dict[str, Any]) -> SessionClosed:
        self._client._sessions.pop(self._job, None)
        self._client._session_lines.pop(self._job, None)
        return SessionClosed(self._job, status.get("reason") or status.get("state", "ended"))


def _session_line(driver: Any, timeout_s: float) -> Line | None:
    """The session driver's node socket, where this process is on its node, else None."""
    import ray

    try:
        found = ray.get(driver.endpoint.remote(), timeout=timeout_s)
    except Exception:  # a dying driver: the actor path tells what became of it
        return None
    if found is None or found[0] != ray.get_runtime_context().get_node_id():
        return None
    return Line(found[1])


def _check_budget(device_seconds: float | None) -> None:
    if device_seconds is not None and not math.isfinite(device_seconds):
        raise ValueError(f"a budget must be a finite number of device-seconds, got {device_seconds!r}")
