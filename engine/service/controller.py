"""The engine service's controller: one detached, named Ray actor (``EngineService``) behind
``engine.control.EngineClient``.

It owns the shared worker groups and the jobs' drivers. Where a job runs and when it starts is the
placer's decision (``engine.service.placing``: the simulator's admission code on the cluster Ray
reports): a group takes jobs of its kind while their demands sum to the load limit, then another
group of that kind is formed on a node with room, else the job waits ``queued`` with its position
and reason, holding no driver. New groups start with the service's lock let go (a start-up takes
seconds): meanwhile other jobs are submitted, placed (on the starting groups too), cancelled and
finished, and a job starts once all its groups are up. Jobs on one group share it; the scheduler
time-slices it. A driver runs the algorithm loop as a Ray actor of its own, never inside the
caller's process: a Celery redelivery or a worker restart neither re-runs nor kills training.

Job state lives in the job's event log (``state`` events: queued, running, paused, succeeded,
failed, cancelled). One writer at a time: the service writes ``queued`` before the driver exists,
``placed`` (the job's groups and their nodes) when it admits the job, and ``cancelled`` / ``failed``
after the driver is gone; while the driver runs, it writes everything, including
the pause and resume the service asks it to record.

It also starts the scheduler (``engine.scheduler.live``), first and after one died, with the
tenants' weights and budgets the platform pushed (recorded across restarts by
``engine.service.tenants``, budgets less what was used since) and the running jobs' priorities.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from engine.errors import EngineError, SessionClosed, UnknownJob, fault_reason, is_engine_fault
from engine.paths import events_path
from engine.service.cluster import (
    architecture,
    choose_nodes,
    held_slots,
    node_usage,
    ray_free_devices,
    read_nodes,
)
from engine.service.eventlog import TERMINAL_STATES, EventLog, LogEnded, has_ended, read_events
from engine.service.placing import GroupKey, LiveGroup, admission_round, declared, group_keys, live_policy
from engine.service.tenants import TenantBook
from engine.spec import SESSION, JobSpec, ServiceConfig, check_job_id, priority_factor
from engine.support.atomic_json import write_json
from engine.support.local_node import here
from engine.workers import faults

_log = logging.getLogger(__name__)

MAX_EVENTS = 10_000  # per events() call

ADMIT_EVERY_S = 2.0  # while jobs wait, how often the service looks for room again
RELEASE_WAIT_S = 10.0  # the most a released group's slots take to show free in Ray's view
DRAINED_FILE = "drained_nodes.json"  # under the data directory: the nodes an admin drained
SESSION_NOT_RESUMED = ("a session is not restarted (its loop runs at the tenant): open another and "
                       "load its last checkpoint")
PING_WAIT_S = 10.0  # while healing, how long a rank has to answer before it counts as alive but busy


def job_state(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The latest ``state`` event's data (``{"state": ..., "reason": ...}``), or ``{}``."""
    state: dict[str, Any] = {}
    for e in events:
        if e["kind"] == "state":
            state = dict(e["data"], seq=e["seq"], ts=e["ts"])
    return state


@ray.remote(num_cpus=0, max_concurrency=8)
class EngineService:
    def __init__(self, data_dir: str, config: dict[str, Any]):
        self.data_dir = Path(data_dir)
        self.config = ServiceConfig(**config)
        self.groups: dict[str, Any] = {}  # name -> WorkerGroup
        self.group_keys: dict[str, GroupKey] = {}  # group name -> (side, backend, ranks, affinity)
        self.job_keys: dict[str, list[GroupKey]] = {}  # job id -> the kinds of groups it needs, while known here
        self.job_groups: dict[str, list[str]] = {}  # job id -> the groups it runs on (names), once admitted
        self.waiting: list[str] = []  # jobs queued for device slots, first come first served (no driver yet)
        self.reasons: dict[str, str] = {}  # waiting job -> why it waits
        self.closing = False
        self.drivers: dict[str, Any] = {}  # job id -> driver actor, while it runs
        self.runs: dict[str, Any] = {}  # job id -> ObjectRef of its run()
        self.cancelling: set[str] = set()
        self.jobs: dict[str, tuple[JobSpec, str]] = {}  # job id -> (spec, tenant), while it runs here
        self.priorities: dict[str, float] = {}  # job id -> priority factor, while it runs here (absent: 1)
        self.tenants = TenantBook(self.data_dir)  # the platform's last pushes, for a new scheduler
        self.tenant_lock = threading.RLock()  # one push at a time: the book records them in the scheduler's order
        self.recoveries: dict[str, int] = {}  # job id -> times it was resumed after an engine fault
        self.replacing: set[str] = set()  # jobs whose driver the service kills to start a new one
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # groups started or a starting job placed or gone
        # while their groups start (the lock let go): group name -> (key, node), and job -> its
        # groups (started or not); such a job is neither waiting nor running
        self.unstarted: dict[str, tuple[GroupKey, str]] = {}
        self.starting: dict[str, list[str]] = {}
        self.formed: dict[str, float] = {}  # group name -> when it started (monotonic), while it runs
        self.start_s: dict[str, float] = {}  # group name -> seconds it took to start, while it runs
        self.idle_since: dict[str, float] = {}  # group name -> since when no running job uses it
        self.held_device_s = 0.0  # device-seconds of the groups released so far, idle time included
        self.resuming: set[str] = set()  # waiting jobs whose driver resumes from their log (restart, drain)
        self.admitted_at = 0.0  # when the watch last looked for room for waiting jobs (monotonic)
        # nodes an admin drained: no group is placed there (kept across a restart of the service)
        drained = self.data_dir / DRAINED_FILE
        self.draining: set[str] = set(json.loads(drained.read_text())) if drained.is_file() else set()
        self._adopt_unfinished()
        threading.Thread(target=self._watch, daemon=True).start()

    # -- worker groups ----------------------------------------------------------------------------
    def _group_name(self, key: GroupKey, taken: set[str] = frozenset()) -> str:
        """A name for a new group of ``key``: its kind, then a number from the second on (none of
        the groups', none in ``taken``)."""
        side, kind, ranks, affinity = key
        base = f"{kind}-{side}" + (f"-tp{ranks}" if ranks > 1 else "") + (f"-{affinity}" if affinity else "")
        return next(n for n in (base, *(f"{base}-{i}" for i in range(2, 10_000)))
                    if n not in self.groups and n not in self.unstarted and n not in taken)

    def _reserve_groups(self, wanted: list[tuple[GroupKey, str]]) -> tuple[list[str], list[tuple[str, GroupKey, str]]]:
        """Groups of these (key, node)s for a placement: for each, an idle one of that key there,
        else a new one (recorded in ``unstarted``; the caller starts it), after releasing idle
        groups there until Ray has the slots free. The names, and the (name, key, node)s to start.
        Holds the lock."""
        names: list[str] = []
        fresh: list[tuple[str, GroupKey, str]] = []  # (name, key, node) to start
        for key, node in wanted:
            idle = [n for n in self._idle_groups() if list(self.groups[n].nodes[:1]) == [node] and n not in names]
            same = [n for n in idle if self.group_keys[n] == key]
            if same:
                self.idle_since.pop(same[0], None)
                names.append(same[0])
                continue
            others = sum(1 for _, n in self.unstarted.values() if n == node)  # starting there (maybe unseen by Ray)
            need = self.config.devices_per_group * (1 + others + sum(1 for _, _, n in fresh if n == node))
            for name in idle:
                if ray_free_devices().get(node, float("inf")) >= need - 1e-9:
                    break
                self._release_group(name)
            name = self._group_name(key, {n for n, _, _ in fresh})
            fresh.append((name, key, node))
            names.append(name)
            self.unstarted[name] = (key, node)
        return names, fresh

    def _start_in_background(self, fresh: list[tuple[str, GroupKey, str]]) -> None:
        """Start these groups at once (``_start_at_once``) in a thread of their own, so that no
        caller waits for them with the lock (or the watch, which must notice drivers that end,
        with its thread); once they are up, record those that started (kept even if another
        failed: idle, reused or released; shut down if the service is closing, released if their
        node was drained meanwhile) and start the jobs placed on them (``_start_ready``)."""
        if not fresh:
            return

        def start() -> None:
            started: dict[str, Any] = {}
            failed: Exception | None = RuntimeError("worker groups did not start")
            try:
                started, failed = self._start_at_once(fresh)
            finally:
                with self.lock:
                    self._install(fresh, started)
                    if failed is not None:
                        _log.warning("engine: worker groups did not start: %s", fault_reason(failed))
                    self._start_ready(failed)

        threading.Thread(target=start, daemon=True, name="groups-start").start()

    def _install(self, fresh: list[tuple[str, GroupKey, str]], started: dict[str, Any]) -> None:
        """Record the groups of ``fresh`` that ``started``. Holds the lock."""
        for name, key, node in fresh:
            self.unstarted.pop(name, None)
            if name not in started:
                continue
            group = self.groups[name] = started[name]
            self.group_keys[name] = key
            if self.closing:
                self.groups.pop(name)
                self.group_keys.pop(name)
                group.shutdown()
                self._held_until_now(group)
            elif node in self.draining:
                self._release_group(name)

    def _start_at_once(self, fresh: list[tuple[str, GroupKey, str]]) -> tuple[dict[str, Any], Exception | None]:
        """Start these (name, key, node) groups concurrently: those that started, and the first
        failure (None if none failed)."""
        if not fresh:
            return {}, None
        started: dict[str, Any] = {}
        failed: Exception | None = None
        with ThreadPoolExecutor(max_workers=len(fresh), thread_name_prefix="group-start") as pool:
            futures = {pool.submit(self._start_group, key, name, node): name for name, key, node in fresh}
            for future, name in futures.items():
                try:
                    started[name] = future.result()
                except Exception as exc:
                    failed = failed or exc
        return started, failed

    def _idle_groups(self) -> list[str]:
        """Groups no running or admitted job uses, by name."""
        used = {n for names in self.job_groups.values() for n in names}
        return [n for n in sorted(self.groups) if n not in used]

    def _start_group(self, key: GroupKey, name: str, node: str | None = None) -> Any:
        """Start group ``name`` of ``key``, its ranks on ``node`` (None: on one node Ray picks)."""
        from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS
        from engine.workers.group import Swapping, WorkerGroup

        side, kind, ranks, _ = key
        # (a group of this name released or lost before is gone: _release_group and _heal wait for that)
        started = time.monotonic()  # its slots are held from here: start-up counts
        group = WorkerGroup.start(
            name, kind, world_size=ranks, threads=self.config.threads, data_dir=self.data_dir,
            devices_per_rank=self.config.devices_per_group / ranks,
            swapping=Swapping(max_resident=self.config.max_resident),
            serves=TRAIN_FUNCTIONS if side == "train" else ROLLOUT_FUNCTIONS, node=node)
        self.formed[name] = started
        self.start_s[name] = time.monotonic() - started
        return group

    def _usage(self, *, draining: bool = False) -> list[dict[str, Any]]:
        """The nodes' slots, free as the engine counts them and as Ray does (other actors may hold
        slots too); the drained nodes only with ``draining`` (flagged so)."""
        starting = [(node, self.config.devices_per_group) for _, node in list(self.unstarted.values())]
        rows = node_usage(read_nodes(), held_slots(list(self.groups.values())) + starting, ray_free_devices())
        for row in rows:
            row["draining"] = row["id"] in self.draining
        return [row for row in rows if draining or not row["draining"]]

    def _place(self, sizes: list[float], near: list[Any]) -> tuple[list[dict[str, Any]], list[str] | None]:
        """The nodes' usage, and nodes for new groups of ``sizes`` (``choose_nodes``), in the node
        group of the groups ``near`` first; None where they do not fit now."""
        usage = self._usage()
        group_of = {row["id"]: row["node_group"] for row in usage}
        prefer = {group_of[n] for g in near for n in g.nodes if n in group_of}
        return usage, choose_nodes(usage, sizes, prefer=prefer)

    def _held_until_now(self, group: Any) -> None:
        """Count a group's device-seconds held (it is shut down now)."""
        started = self.formed.pop(group.name, None)
        self.start_s.pop(group.name, None)
        if started is not None:
            self.held_device_s += (time.monotonic() - started) * group.devices

    def held_device_seconds(self) -> float:
        """Device-seconds the engine's groups have held: released ones, and running ones so far."""
        now = time.monotonic()
        return self.held_device_s + sum((now - self.formed[g.name]) * g.devices
                                        for g in self.groups.values() if g.name in self.formed)

    def _release_idle(self) -> list[str]:
        """Release the groups no running job uses: with ``dedicated`` at once (no other job can use
        them), else once idle ``idle_release_s``; returns their names. Holds the lock."""
        now = time.monotonic()
        idle = self._idle_groups()
        due = []
        for name in sorted(self.groups):
            if name not in idle:
                self.idle_since.pop(name, None)
                continue
            since = self.idle_since.setdefault(name, now)
            limit = 0.0 if self.config.dedicated else self.config.idle_release_s
            if limit is not None and now - since >= limit:
                due.append(name)
        self._release_groups(due)
        return due

    def _release_group(self, name: str) -> None:
        """``_release_groups`` of one."""
        self._release_groups([name])

    def _release_groups(self, names: list[str]) -> None:
        """Shut down groups no job uses (their devices are needed for another, or they idled), all
        at once, and return once their ranks are gone and Ray counts their device slots free (or
        after ``RELEASE_WAIT_S``)."""
        groups = [self.groups.pop(name) for name in names]
        if not groups:
            return
        for name, group in zip(names, groups, strict=True):
            self.group_keys.pop(name, None)
            self.idle_since.pop(name, None)
            self._held_until_now(group)
        with contextlib.suppress(RayActorError):
            ray.get(self._scheduler().remove_groups.remote(list(names)))
        before = ray_free_devices()
        freed: dict[str, float] = {}
        for node, slots in held_slots(groups):
            freed[node] = freed.get(node, 0.0) + slots
        for group in groups:
            group.shutdown()
        for group in groups:
            for rank in range(len(group.ranks)):
                try:
                    _wait_name_free(f"wpg:{group.name}:{rank}")
                except TimeoutError as exc:  # killed, but Ray has not seen it die yet (a loaded node)
                    _log.warning("engine: releasing %s: %s", group.name, exc)
        deadline = time.monotonic() + RELEASE_WAIT_S
        while time.monotonic() < deadline:
            now = ray_free_devices()
            if not now or all(now.get(n, 0.0) >= before.get(n, 0.0) + d - 1e-9 for n, d in freed.items()):
                return
            time.sleep(0.1)

    def _admit(self) -> None:
        """Place the waiting jobs the placer admits (``placing.admission_round``: first come first
        served, the first that does not fit holds the later ones; the groups starting count as
        there), each on the groups it places, new ones reserved; the round's new groups then
        start at once in the background (``_start_in_background``), and each job starts once all
        its groups are up (``_start_ready``). The others keep its reasons. Holds the lock."""
        if not self.waiting or self.closing:
            return
        groups = [LiveGroup(n, self.group_keys[n], g.nodes[0] if g.nodes else "", g.devices)
                  for n, g in sorted(self.groups.items())]
        groups += [LiveGroup(n, key, node, self.config.devices_per_group)
                   for n, (key, node) in sorted(self.unstarted.items())]
        running = {job: self.job_groups[job] for job in [*self.drivers, *self.starting] if job in self.job_groups}
        decided = admission_round(self._usage(), groups, running, [(j, self.job_keys[j]) for j in self.waiting],
                                  group_devices=self.config.devices_per_group, demand=declared(self.config),
                                  policy=live_policy(self.config))
        self.reasons = dict(decided.reasons)
        made: dict[str, str] = {}  # the round's new groups: the placer's name -> the group's
        fresh: list[tuple[str, GroupKey, str]] = []
        for admitted in decided.admitted:
            placed = [(ref, key, node) for key, ref, node in admitted.groups if node]  # new ones: a node each
            names, more = self._reserve_groups([(key, node) for _, key, node in placed])
            made.update((ref, name) for (ref, _, _), name in zip(placed, names, strict=True))
            fresh += more
            # not idle from here, never released for the next job
            self.starting[admitted.job] = self.job_groups[admitted.job] = [made.get(ref, ref)
                                                                           for _, ref, _ in admitted.groups]
            self.waiting.remove(admitted.job)
        self._start_ready()  # those placed on groups up already start now, not after the new ones
        self._start_in_background(fresh)

    def _start_ready(self, failed: Exception | None = None) -> None:
        """Start the placed jobs whose groups are all up; one whose group did not start
        (``failed``) or went meanwhile waits again, first (the watch tries again); one whose driver
        does not start fails, with the reason. Holds the lock."""
        for job, names in list(self.starting.items()):
            if job not in self.starting or any(n in self.unstarted for n in names):
                continue  # started meanwhile (below), or placed on groups another round starts
            del self.starting[job]
            if not all(n in self.groups for n in names):
                del self.job_groups[job]
                self.waiting.insert(0, job)
                self.reasons[job] = (f"its worker groups did not start: {fault_reason(failed)}" if failed else
                                     "its worker groups were released before it started")
                continue
            resume = job in self.resuming
            self.resuming.discard(job)
            # written before the driver, the next writer, starts
            _append(self.data_dir, job, "placed", {
                "groups": names, "nodes": [self.groups[n].nodes[0] if self.groups[n].nodes else None for n in names]})
            try:
                if resume and self.status(job).get("state") == "paused":
                    ray.get(self._scheduler().pause.remote(job))  # its calls wait, as before the restart
                self._start_driver(job, resume=resume)
            except Exception as exc:  # no caller to tell: the job's log does
                _log.warning("engine: the driver of %s did not start: %s", job, fault_reason(exc))
                if job in self.drivers:
                    self._stop_driver(job)
                self._finish(job, {"state": "failed", "reason": f"its driver did not start: {fault_reason(exc)}"})
        self.changed.notify_all()

    # -- the scheduler ------------------------------------------------------------------------------
    def _scheduler(self) -> Any:
        """The scheduler actor; started, with what a new one must know, if none runs."""
        from engine.scheduler.live import SCHEDULER_NAME

        try:
            return ray.get_actor(SCHEDULER_NAME)
        except ValueError:
            return self._start_scheduler()

    def _start_scheduler(self) -> Any:
        """Start the scheduler with the groups, the tenants' weights and budgets (each pushed
        budget less the usage since its push) and the running jobs' priorities, so it orders and
        holds calls by them from its first call on."""
        from engine.scheduler.live import scheduler_service

        with self.tenant_lock:
            tenants = self.tenants.for_scheduler()
        return scheduler_service(list(self.groups.values()), tenants=tenants,
                                 priorities={job: self.priorities[job] for job in self.jobs if job in self.priorities})

    def _start_driver(self, job_id: str, *, resume: bool = False) -> None:
        """Start the job's driver (``resume``: it replaces one that died). Holds the lock."""
        from engine.service.driver import JobDriver
        from engine.service.session import PIPELINE, SessionDriver

        self._scheduler()  # one started here, not by the driver's router, has the tenants' weights and budgets
        spec, tenant = self.jobs[job_id]
        groups = [self.groups[name] for name in self.job_groups[job_id]]
        log = str(events_path(self.data_dir, job_id))
        # beside this service (a worker node's loss leaves it running) and the scheduler (whose
        # node-local socket its router then uses)
        if spec.algorithm == SESSION:  # its run, its note and close, and the tenant's calls at once
            driver = SessionDriver.options(name=f"driver:{job_id}", max_concurrency=PIPELINE + 3,
                                           scheduling_strategy=here()).remote(
                job_id, spec, groups, log, tenant, self.config.session_idle_s)
        else:
            driver = JobDriver.options(name=f"driver:{job_id}", max_concurrency=2, scheduling_strategy=here()).remote(
                job_id, spec, groups, log, tenant, resume)
        self.drivers[job_id] = driver
        self.runs[job_id] = driver.run.remote()

    # -- the service API ----------------------------------------------------------------------------
    def submit_job(self, job_id: str, spec: dict[str, Any], tenant: str = "",
                   priority: str = "normal") -> dict[str, Any]:
        """``priority``: a name in ``engine.spec.PRIORITIES``; it orders the job's calls within
        its tenant's share. Idempotent by job id (a second submission changes nothing)."""
        job_id = check_job_id(job_id)
        parsed = JobSpec.from_dict(spec)
        factor = priority_factor(priority)
        path = events_path(self.data_dir, job_id)
        if path.exists():
            return self.status(job_id)  # submitted before: never a second driver
        keys = group_keys(job_id, parsed, dedicated=self.config.dedicated)  # may read a model folder: not locked
        with self.lock:
            if job_id in self.drivers or path.exists():
                return self.status(job_id)
            if factor != 1.0:
                self.priorities[job_id] = factor
                try:  # before its first call (a scheduler that died meanwhile is started with it)
                    ray.get(self._scheduler().set_priority.remote(job_id, factor))
                except RayActorError as exc:
                    _log.warning("engine: priority of %s not set yet: %s", job_id, fault_reason(exc))
            log = EventLog(path)
            # tenant and priority too: a service started after this one died queues the job again
            log.append("state", {"state": "queued", "tenant": tenant, "priority": priority}, durable=True)
            log.append("spec", parsed.to_dict(), durable=True)
            log.close()
            self.jobs[job_id] = (parsed, tenant)
            self.job_keys[job_id] = keys
            self.waiting.append(job_id)
            self._admit()
            while job_id in self.starting:  # placed on groups another submission's round starts
                self.changed.wait(timeout=1.0)
        return self.status(job_id)

    def status(self, job_id: str) -> dict[str, Any]:
        path = events_path(self.data_dir, job_id)
        if not path.exists():
            raise UnknownJob(job_id)
        events = read_events(path)
        out = {"job": job_id, **job_state(events), "last_seq": events[-1]["seq"] if events else 0,
               "active": job_id in self.drivers}
        if job_id in self.waiting:  # queued here for device slots: no driver, no actor of its own
            out.update(position=self.waiting.index(job_id) + 1, reason=self.reasons.get(job_id, ""))
        return out

    def session(self, job_id: str) -> Any:
        """The driver of session ``job_id`` to send its calls to; None while it waits for groups.
        SessionClosed: it has ended (why, from its log); ValueError: the job is not a session."""
        with self.lock:  # a job of this service's: its spec is at hand, its log needs no reading
            job = self.jobs.get(job_id)
            if job is not None:
                _check_session(job_id, job[0].algorithm)
                running = job_id in self.drivers and job_id not in self.cancelling
                return self.drivers[job_id] if running else None  # else: queued for groups
        status = self.status(job_id)  # ended, or being submitted
        spec = next((e["data"] for e in read_events(events_path(self.data_dir, job_id), limit=4)
                     if e["kind"] == "spec"), None)
        if spec is None:
            return None  # being submitted: its spec is the log's next line
        _check_session(job_id, spec.get("algorithm"))
        if status.get("state") not in TERMINAL_STATES:
            return None  # being submitted: queued once the service holds it
        raise SessionClosed(job_id, status.get("reason") or status.get("state", "ended"))

    def events(self, job_id: str, after_seq: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        path = events_path(self.data_dir, job_id)
        if not path.exists():
            raise UnknownJob(job_id)
        return read_events(path, after_seq=after_seq, limit=max(1, min(limit, MAX_EVENTS)))

    def pause(self, job_id: str) -> dict[str, Any]:
        return self._set_paused(job_id, True)

    def resume(self, job_id: str) -> dict[str, Any]:
        return self._set_paused(job_id, False)

    def _set_paused(self, job_id: str, paused: bool) -> dict[str, Any]:
        with self.lock:
            driver = self.drivers.get(job_id)
            current = self.status(job_id)  # unknown: raises
            if (current.get("state") == "paused") == paused:
                return current  # already so: nothing to do, nothing logged
            if driver is None and job_id not in self.resuming:
                return current  # not running here (finished, or queued to run for the first time)
            scheduler = self._scheduler()
            # queued calls stay queued while paused (never dropped); the running one finishes
            ray.get((scheduler.pause if paused else scheduler.resume).remote(job_id))
            state = {"state": "paused" if paused else "running"}
            if driver is None:  # placed again (moved off a node), not started yet: its driver resumes
                _append(self.data_dir, job_id, "state", state)  # in the state its log ends in
            else:
                ray.get(driver.note.remote("state", state))
        return self.status(job_id)

    def set_budget(self, tenant: str, device_seconds: float | None) -> float | None:
        """The device-seconds ``tenant``'s jobs may still use (None: no limit); returns what the
        scheduler had left before (None: no limit)."""
        return self.set_tenant(tenant, None, device_seconds)

    def set_tenant(self, tenant: str, weight: float | None, device_seconds: float | None) -> float | None:
        """``tenant``'s weight (its fair share; None: unchanged) and the device-seconds its jobs may
        still use (None: no limit), recorded for a scheduler started later; returns the budget
        the scheduler had left before (None: no limit)."""
        with self.tenant_lock:
            before, at = ray.get(self._scheduler().set_tenant.remote(tenant, weight, device_seconds))
            self.tenants.pushed(tenant, budget=device_seconds, at=at, weight=weight)
        return before

    def budget_left(self, tenant: str) -> float | None:
        return ray.get(self._scheduler().budget_left.remote(tenant))

    def cancel(self, job_id: str, reason: str = "") -> dict[str, Any]:
        with self.lock:
            if job_id in self.waiting or job_id in self.starting:  # it never started: nothing to stop
                if job_id in self.waiting:
                    self.waiting.remove(job_id)
                self.starting.pop(job_id, None)  # its groups, once up, are idle
                self.reasons.pop(job_id, None)
                self._finish(job_id, {"state": "cancelled", "reason": reason or "cancelled"})
                self._admit()
                return self.status(job_id)
            driver = self.drivers.get(job_id)
            if driver is None:
                return self.status(job_id)
            self.cancelling.add(job_id)
            ref = self.runs[job_id]
        ray.kill(driver, no_restart=True)
        with contextlib.suppress(Exception):  # it died, which is the point
            ray.get(ref, timeout=60)
        self._finish(job_id, {"state": "cancelled", "reason": reason or "cancelled"})
        return self.status(job_id)

    def cluster_snapshot(self) -> dict[str, Any]:
        """The groups, jobs and scheduler counters; the cluster's ``nodes`` as Ray reports them
        now (with the device slots the groups leave free) and the ``wpgs`` placed on them; the
        ``control_node`` this service, the scheduler and the drivers run on, and each running
        job's ``drivers`` entry: its node and resident memory (None where it did not answer); the
        ``held_device_seconds`` of every group so far, idle time included (what a provider pays)."""
        # not under the lock (the scheduler and the drivers are asked): copies, as groups start,
        # jobs end and groups are released meanwhile in other threads
        groups, keys, unstarted = dict(self.groups), dict(self.group_keys), dict(self.unstarted)
        stats = ray.get(self._scheduler().stats.remote()) if groups else {}
        resident = stats.get("resident", {})
        models: dict[str, set[str]] = {}  # group name -> models of the running jobs that use it
        for job, (spec, _) in list(self.jobs.items()):
            for name in self.job_groups.get(job, ()) if job in self.drivers else ():
                models.setdefault(name, set()).add(spec.model)
        keyed = [(keys[n], g) for n, g in sorted(groups.items()) if n in keys]
        now = time.monotonic()
        return {
            "groups": [{"name": g.name, "side": side, "backend": kind, "ranks": ranks,
                        "devices": self.config.devices_per_group, "max_resident": self.config.max_resident}
                       for (side, kind, ranks, _), g in keyed],
            "nodes": self._usage(draining=True),
            "wpgs": [{"name": g.name, "node": g.nodes[0] if g.nodes else None, "rank_nodes": list(g.nodes),
                      "side": side, "backend": kind, "models": sorted(models.get(g.name, ())),
                      "architectures": sorted({a for m in models.get(g.name, ()) if (a := architecture(m))}),
                      "devices": g.devices, "start_s": self.start_s.get(g.name),
                      # held for: since it began to start (start-up included)
                      "up_s": now - self.formed[g.name] if g.name in self.formed else None,
                      "resident_jobs": [j for j in resident.get(g.name, []) if j in self.jobs], "starting": False}
                     for (side, kind, _, _), g in keyed]
            # placed, starting (their slots held): where the jobs placed on them will run
            + [{"name": name, "node": node, "rank_nodes": [], "side": side, "backend": kind, "models": [],
                "architectures": [], "devices": self.config.devices_per_group, "start_s": None, "up_s": None,
                "resident_jobs": [], "starting": True}
               for name, ((side, kind, _, _), node) in sorted(unstarted.items())],
            "jobs": {job: self.status(job).get("state") for job in sorted(self.drivers)},
            "drivers": self._drivers_memory(),
            "queued": [{"job": job, "position": i + 1, "reason": self.reasons.get(job, "")}
                       for i, job in enumerate(self.waiting)],
            "scheduler": stats,
            "control_node": ray.get_runtime_context().get_node_id(),
            "held_device_seconds": self.held_device_seconds(),
        }

    def _drivers_memory(self) -> list[dict[str, Any]]:
        refs = {job: driver.memory.remote() for job, driver in sorted(self.drivers.items())}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=PING_WAIT_S)
        out = []
        for job, ref in refs.items():
            try:
                out.append({"job": job, **ray.get(ref, timeout=0)})
            except Exception:  # busy past the wait, or gone: the snapshot does not wait on it
                out.append({"job": job, "node": None, "rss_mb": None, "torch": None})
        return out

    def drain(self, node: str, undo: bool = False) -> dict[str, Any]:
        """Take ``node`` (its id, or a prefix only it has) out of placement: the jobs whose groups
        run there stop, and wait first in the queue to be placed elsewhere, resuming from their
        last checkpoint (a ``recovery`` event marks the work redone: it is not billed twice, and it
        is no fault: it counts toward no limit); its groups are released. ``undo``: it takes
        groups again. Returns the node's id and the jobs moved."""
        with self.lock:
            matches = [n.id for n in read_nodes() if node and n.id.startswith(node)]
            if len(matches) != 1:
                raise ValueError(f"node: {'no node' if not matches else 'more than one node'} of the cluster "
                                 f"has an id starting {node!r}")
            (node,) = matches
            if undo:
                self.draining.discard(node)
                self._keep_drained()
                self._admit()
                return {"node": node, "draining": False, "moved": []}
            self.draining.add(node)
            self._keep_drained()
            there = {name for name, g in self.groups.items() if node in g.nodes}
            moved = sorted(job for job in self.drivers if there & set(self.job_groups.get(job, ())))
            for job in reversed(moved):
                self._move_off(job, f"node {node[:12]} was drained by an admin; placed again and resumed")
            self._release_groups(sorted(there))  # no job uses them now
            self._admit()
        return {"node": node, "draining": True, "moved": moved}

    def _keep_drained(self) -> None:
        """Record the drained nodes where a service started later reads them."""
        write_json(self.data_dir / DRAINED_FILE, sorted(self.draining))

    def _move_off(self, job_id: str, why: str) -> None:
        """Stop the job (``_stop_for_resume``) and queue it first, to resume from its last
        checkpoint once placed again. Holds the lock."""
        self._stop_for_resume(job_id, why)
        self.drivers.pop(job_id, None)
        self.runs.pop(job_id, None)
        self.job_groups.pop(job_id, None)
        self.resuming.add(job_id)
        self.waiting.insert(0, job_id)

    def estimate(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A job's pre-run estimate (``engine.accounting.estimate``): its predicted calls, wall and step seconds,
        and whether they come from a stored profile of its shape or the cost model. Needs no worker
        group; the platform calls ``engine.accounting.estimate`` in-process instead (a web request never waits
        on Ray)."""
        from engine.accounting.estimate import estimate

        return estimate(JobSpec.from_dict(spec)).to_dict()  # profiles: PLEXRL_HOME's, where drivers write

    def shutdown(self) -> None:
        self.closing = True  # nothing waiting starts any more (groups still starting are shut down once up)
        for job in [*self.waiting, *self.starting, *self.drivers]:
            self.cancel(job, reason="engine shut down")
        for g in self.groups.values():
            g.shutdown()
            self._held_until_now(g)
        self.groups.clear()

    # -- supervision --------------------------------------------------------------------------------
    def _finish(self, job_id: str, terminal: dict[str, Any] | None) -> None:
        """The driver is gone: forget it; write ``terminal`` unless the log already ends the job."""
        with self.lock:
            self.drivers.pop(job_id, None)
            self.runs.pop(job_id, None)
            job = self.jobs.pop(job_id, None)
            self.priorities.pop(job_id, None)
            self.cancelling.discard(job_id)
            path = events_path(self.data_dir, job_id)
            if terminal is not None and job_state(read_events(path)).get("state") not in TERMINAL_STATES:
                log = EventLog(path)
                with contextlib.suppress(LogEnded):  # the driver wrote its own end meanwhile
                    log.append("state", terminal, durable=True)
                log.close()
            if job is not None:
                self._release(job_id)
            self.job_groups.pop(job_id, None)
            self.job_keys.pop(job_id, None)
            self._admit()  # its groups may be what a waiting job needs
            if self._release_idle():
                self._admit()  # their slots may be (dedicated: they are freed as its job ends)

    def _release(self, job_id: str) -> None:
        """An ended job's calls, estimates and states leave the scheduler, the groups and the
        StateManager (else every job ever run would keep its state there). Best effort: a group or
        scheduler that died meanwhile holds nothing of it any more."""
        try:
            self._drop_calls_and_states(job_id)
            with contextlib.suppress(ValueError):  # a cancelled job's call still running: kept
                ray.get(self._scheduler().forget.remote(job_id))
        except Exception as exc:
            _log.warning("engine: releasing %s: %s", job_id, fault_reason(exc))

    def _drop_calls_and_states(self, job_id: str) -> None:
        """The job's queued calls leave the scheduler (its running ones finish), then its states
        leave the groups, once those calls are done (a rank runs its calls in order)."""
        ray.get(self._scheduler().abandon.remote(job_id))
        for name in self.job_groups.get(job_id, ()):
            if name in self.groups:
                self.groups[name].drop_job(job_id)

    def _watch(self) -> None:
        """Notice drivers that end: success and failure are logged by the driver itself; a driver that
        died (killed, out of memory, its node lost) is logged here as failed. While jobs wait, look
        for room again every ``ADMIT_EVERY_S``; release groups idle ``idle_release_s``. An error in
        one pass (a Ray call that timed out under load, a bug) is logged, and the next pass goes on:
        a watch that ended would leave every waiting job queued for good and no driver's end seen."""
        while True:
            try:
                self._watch_pass()
            except Exception:
                _log.exception("engine: the watch's pass failed; the next one goes on")
                time.sleep(0.5)

    def _watch_pass(self) -> None:
        """One pass of ``_watch``."""
        faults.check(self.data_dir, "watch")
        with self.lock:
            pending = {ref: job for job, ref in self.runs.items()
                       if job not in self.cancelling and job not in self.replacing}
            if self.waiting and time.monotonic() - self.admitted_at > ADMIT_EVERY_S:
                self.admitted_at = time.monotonic()
                try:
                    self._admit()  # slots may have freed outside the engine (another actor ended)
                except Exception as exc:  # a group that failed to start: the job waits, the watch goes on
                    _log.warning("engine: admitting %s: %s", self.waiting[0], fault_reason(exc))
            if self.config.idle_release_s is not None and not self.closing:
                self._release_idle()
        if not pending:
            time.sleep(0.2)
            return
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        for ref in ready:
            job = pending[ref]
            try:
                ray.get(ref)
            except Exception as exc:  # a driver that ends badly: recovered, or a failed job
                if job in self.cancelling or self.runs.get(job) != ref:
                    continue
                if is_engine_fault(exc):  # it died, or something under it did
                    self._recover(job, exc, ref)
                else:
                    self._finish(job, {"state": "failed", "reason": f"driver ended: {type(exc).__name__}"})
                continue
            self._finish(job, None)

    # -- recovery -----------------------------------------------------------------------------------
    def _adopt_unfinished(self) -> None:
        """Jobs whose logs an earlier service left unfinished (it died, and its drivers and groups,
        which it owned, with it): each waits again in submission order, with its tenant and
        priority; one that had run resumes from its last checkpoint once admitted, as after an
        engine fault (a ``recovery`` event; the same limit, counted in its log), one past the limit
        fails with the reason. The earlier service's scheduler, if it lives on, orders calls of
        dead drivers on dead groups: it is stopped, and the next one starts with the tenants' book."""
        from engine.scheduler.live import SCHEDULER_NAME, stop_scheduler

        unfinished = [p for p in (self.data_dir / "jobs").glob("*/events.jsonl") if not has_ended(p)]
        if not unfinished:
            return
        stop_scheduler()
        _wait_name_free(SCHEDULER_NAME)
        logs = []
        for path in unfinished:
            _wait_name_free(f"driver:{path.parent.name}")  # the dead service's driver, its log's writer, is gone
            events = read_events(path)  # with what it wrote last
            if events and job_state(events).get("state") not in TERMINAL_STATES:
                logs.append((events[0]["ts"], path.parent.name, events))
        for _, job_id, events in sorted(logs):  # in submission order
            queued = next(e["data"] for e in events if e["kind"] == "state")
            try:
                spec = JobSpec.from_dict(next(e["data"] for e in events if e["kind"] == "spec"))
                keys = group_keys(job_id, spec, dedicated=self.config.dedicated)
            except (StopIteration, ValueError, EngineError) as exc:
                _append(self.data_dir, job_id, "state", {"state": "failed", "reason": f"the engine service "
                                                         f"restarted and cannot resume it: {exc}"})
                continue
            ran = any(e["kind"] == "state" and e["data"]["state"] == "running" for e in events)
            if ran and spec.algorithm == SESSION:
                _append(self.data_dir, job_id, "state", {"state": "failed", "reason": f"the engine service "
                                                         f"restarted; {SESSION_NOT_RESUMED}"})
                continue
            # restarts after faults so far (a drain's move is none: its attempt repeats the last)
            count = max((e["data"].get("attempt", 0) for e in events if e["kind"] == "recovery"), default=0) + 1
            if ran and count > self.config.max_recoveries:
                _append(self.data_dir, job_id, "state", {"state": "failed", "reason": f"the engine service restarted; "
                                                         f"not recovered after {count - 1} restarts"})
                continue
            if ran:
                self.recoveries[job_id] = count
                self.resuming.add(job_id)
                _append_recovery(self.data_dir, job_id, f"the engine service restarted; restart {count} of at most "
                                 f"{self.config.max_recoveries}", count, events)
            self.jobs[job_id] = (spec, queued.get("tenant", ""))
            factor = priority_factor(queued.get("priority", "normal"))
            if factor != 1.0:
                self.priorities[job_id] = factor
            self.job_keys[job_id] = keys
            self.waiting.append(job_id)

    def _recover(self, job_id: str, exc: BaseException, run: Any = None) -> None:
        """An engine fault ended the job's driver: replace what died (the scheduler, worker groups
        that lost a rank), then resume every job that ran on it from its last checkpoint."""
        reason = fault_reason(exc)
        with self.lock:
            if job_id not in self.jobs or (run is not None and self.runs.get(job_id) != run):
                return  # ended, or its driver was replaced meanwhile (a drain): that run is history
            try:
                affected = {job_id} | self._heal()
            except Exception as heal_exc:  # nothing to resume on: fail, with both reasons, not hang
                _log.warning("engine: healing after %s: %s", job_id, fault_reason(heal_exc))
                affected, reason = {job_id}, f"{reason}; then {fault_reason(heal_exc)}"
            for job in sorted(affected & set(self.drivers)):
                if job not in self.drivers:  # ended while groups started for others (the lock let go)
                    continue
                if self.jobs[job][0].algorithm == SESSION:
                    self._stop_driver(job)
                    self._finish(job, {"state": "failed", "reason": f"engine fault ({reason}); {SESSION_NOT_RESUMED}"})
                    continue
                count = self.recoveries[job] = self.recoveries.get(job, 0) + 1
                gone = [n for n in self.job_groups.get(job, ()) if n not in self.groups]
                if gone:  # a group it needs could not be started again (no node has room now)
                    self._stop_driver(job)
                    self._finish(job, {"state": "failed", "reason": f"engine fault, not recovered: {reason}"})
                    continue
                if count > self.config.max_recoveries:
                    self._stop_driver(job)
                    self._finish(job, {"state": "failed", "reason": f"engine fault, not recovered after "
                                                                    f"{count - 1} restarts: {reason}"})
                    continue
                self._replace_driver(job, f"engine fault ({reason}); restart {count} of "
                                          f"at most {self.config.max_recoveries}")

    def _heal(self) -> set[str]:
        """Start a new scheduler if it died (with the tenants' weights and budgets and the jobs'
        priorities: ``_start_scheduler``), and new worker groups for those that lost a rank (a
        call failed on it, or a rank is found dead: its node was lost with the other groups there).
        Returns the running jobs that used what was replaced (all of them for the scheduler)."""
        from engine.scheduler.live import SCHEDULER_NAME

        try:
            ray.get(ray.get_actor(SCHEDULER_NAME).ping.remote(), timeout=60)
            scheduler_ok = True
        except Exception:
            scheduler_ok = False
        affected: set[str] = set()
        if not scheduler_ok:
            _wait_name_free(SCHEDULER_NAME)
            scheduler = self._start_scheduler()
            affected |= set(self.drivers)
            paused = [job for job in self.drivers if self.status(job).get("state") == "paused"]
            ray.get([scheduler.pause.remote(job) for job in paused])
        else:
            scheduler = self._scheduler()
        lost = set(ray.get(scheduler.lost_groups.remote())) | self._dead_groups()
        for name, group in list(self.groups.items()):
            if name not in lost:
                continue
            group.shutdown()
            self._held_until_now(group)
            for rank in range(len(group.ranks)):
                _wait_name_free(f"wpg:{name}:{rank}")
            del self.groups[name]
            # where it was, if that node group is still there and has room; else where there is room
            _, node = self._place([self.config.devices_per_group], near=[group])
            self.groups[name] = self._start_group(self.group_keys[name], name, node[0] if node else None)
            ray.get(scheduler.add_groups.remote([self.groups[name]]))
            affected |= {job for job in self.drivers if name in self.job_groups.get(job, ())}
        return affected

    def _dead_groups(self) -> set[str]:
        """Groups with a rank that died where no call noticed yet (a lost node takes every group on
        it, and a call fails on one of them first): its ping fails. A rank busy with a call answers
        late, and is not dead."""
        pings = {ref: g.name for g in self.groups.values() for ref in (r.ping.remote() for r in g.ranks)}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=PING_WAIT_S) if pings else ([], [])
        dead = set()
        for ref in answered:
            try:
                ray.get(ref)
            except RayActorError:
                dead.add(pings[ref])
        return dead

    def _stop_driver(self, job_id: str) -> None:
        """Kill the job's driver and wait until it is gone (holds the lock)."""
        self.replacing.add(job_id)
        try:
            ray.kill(self.drivers[job_id], no_restart=True)
            with contextlib.suppress(Exception):  # it died, which is the point
                ray.get(self.runs[job_id], timeout=60)
            _wait_name_free(f"driver:{job_id}")
        finally:
            self.replacing.discard(job_id)

    def _replace_driver(self, job_id: str, why: str) -> None:
        """Kill the job's driver (if alive), drop its calls and states, start one that resumes."""
        self._stop_for_resume(job_id, why)
        self._start_driver(job_id, resume=True)

    def _stop_for_resume(self, job_id: str, why: str) -> None:
        """Kill the job's driver (if alive), drop the calls and states it left, and log a
        ``recovery`` event: ``why``, the fault restarts so far, and the seq after which its work
        is redone (its last checkpoint's). Holds the lock."""
        self._stop_driver(job_id)
        self._drop_calls_and_states(job_id)
        _append_recovery(self.data_dir, job_id, why, self.recoveries.get(job_id, 0),
                         read_events(events_path(self.data_dir, job_id)))


def _check_session(job_id: str, algorithm: str | None) -> None:
    if algorithm != SESSION:
        raise ValueError(f"job {job_id} is not a session: it runs the {algorithm} algorithm itself")


def _append_recovery(data_dir: Path, job_id: str, why: str, attempt: int, events: list[dict[str, Any]]) -> None:
    """Log that the job restarts: ``why``, the fault restarts so far, and the seq after which its
    work is redone (its last checkpoint's, from its ``events``)."""
    from engine.service.driver import redone_after

    _append(data_dir, job_id, "recovery",
            {"message": why, "attempt": attempt, "redone_after_seq": redone_after(events)})


def _append(data_dir: Path, job_id: str, kind: str, data: dict[str, Any]) -> None:
    """Append one durable event to the job's log (the service writes only where no driver does)."""
    log = EventLog(events_path(data_dir, job_id))
    try:
        log.append(kind, data, durable=True)
    finally:
        log.close()


def _wait_name_free(name: str, timeout: float = 30.0) -> None:
    """Until no live actor holds ``name`` (a killed actor's name is released once Ray sees it dead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return
        time.sleep(0.1)
    raise TimeoutError(f"actor {name!r} still holds its name after {timeout:.0f} s")
