"""A session: a job whose algorithm loop runs at the tenant (``JobSpec(algorithm="session")``).

Where a preset job's driver runs GRPO itself (``engine.service.driver``), a session's driver runs
nothing of its own: it serves the tenant's calls, one at a time per call number, through the same
function API, router and scheduler as every job. So a session is scheduled, metered into its
event log, paused and cancelled like any job, and while the tenant computes rewards on their side
it has no call queued: its groups serve others (the gap the platform fills).

Calls are numbered by the caller from 1 (``call(seq, fn, args)``) and go to the scheduler in that
order, whatever order they reach the driver in: a tenant may send several before the first one
has answered (pipelining), and each is answered when its own result is there. The session ends
when the tenant closes it, or when no call has come for ``idle_s`` (its states are then dropped
and its billing stops, like any ended job's); a call after that answers ``SessionClosed``.
A session whose engine part dies is not restarted (its loop is the tenant's, holding state no
checkpoint has): it fails with the reason, and the tenant opens another from a checkpoint.

Calls come through the actor, or from a process of the driver's node (the web server's session
views, ``engine.control.EngineClient``) over its node socket (``endpoint``): the same ``call`` and
``result``, without Ray's hop both ways, a millisecond or more each on a small node, which a loop
of small calls pays on every one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import ray

from engine.client import Client, ModelHandle
from engine.errors import SessionClosed, SpecError, as_fault, is_engine_fault
from engine.scheduler.router import Router
from engine.service.driver import driver_memory
from engine.service.eventlog import EventLog
from engine.service.session_calls import decode, encode
from engine.spec import JobSpec
from engine.support import wire
from engine.workers.group import WorkerGroup

_log = logging.getLogger(__name__)

PIPELINE = 32  # calls of one session in the driver at once (more wait in Ray's queue)
ORDER_WAIT_S = 300.0  # how long a call waits for the calls numbered before it to arrive
KEEP_ANSWERS = 1024  # answers kept for ``result`` (a caller that lost a connection asks again)


@ray.remote(num_cpus=0)
class SessionDriver:
    def __init__(self, job_id: str, spec: JobSpec, groups: list[WorkerGroup], events_path: str,
                 tenant: str = "", idle_s: float = 600.0):
        self.job_id, self.spec, self.idle_s = job_id, spec, idle_s
        self.events = EventLog(Path(events_path))
        self.client = Client(Router(groups, tenant=tenant), self.events)
        self.handles: dict[str, ModelHandle] = {}
        self.cv = threading.Condition()
        self.next_seq = 1  # the number of the call that goes to the scheduler next
        self.last = time.monotonic()  # when a call last came or ended
        self.calls = 0
        self.in_flight: set[int] = set()  # numbers of the calls submitted and not answered yet
        self.waiting: set[int] = set()  # numbers of the calls waiting for their turn
        self.refused: set[int] = set()  # numbers ahead whose calls were refused before their turn
        self.answers: OrderedDict[int, tuple[bool, Any]] = OrderedDict()  # number -> (ok, answer or error)
        self.ended: str | None = None  # why the session ended (None: open)
        self.fault: BaseException | None = None
        self._endpoint: tuple[str, str] | None = None  # (node id, path) of its node socket, once opened
        self._listener: socket.socket | None = None
        self._socket_tried = False
        self.socket_calls = 0  # calls and result fetches that came over the node socket

    def note(self, kind: str, data: dict[str, Any]) -> int:
        """Append an event the engine service asks for (pause, resume), as a job's driver does."""
        return self.events.append(kind, data, durable=True)

    def memory(self) -> dict[str, Any]:
        return driver_memory()

    def stats(self) -> dict[str, int]:
        """Calls answered, and exchanges that came over the node socket (tests and benchmarks)."""
        return {"calls": self.calls, "socket_calls": self.socket_calls}

    def run(self) -> dict[str, Any]:
        """Until the tenant closes the session, it idles past ``idle_s``, or a fault ends it."""
        self.events.append("state", {"state": "running"}, durable=True)
        with self.cv:
            while self.ended is None:
                idle = time.monotonic() - self.last
                if not self.in_flight and idle >= self.idle_s:
                    self.ended = f"closed after {self.idle_s:g} s without a call"
                    break
                self.cv.wait(timeout=1.0 if self.in_flight else max(0.05, self.idle_s - idle))
            self.cv.notify_all()  # calls waiting for their turn learn that the session ended
        self._close_socket()
        if self.fault is not None:  # the engine service fails the session with it
            raise as_fault(self.fault)
        summary = {"calls": self.calls, "closed": self.ended}
        self.events.append("state", {"state": "succeeded", "reason": self.ended}, durable=True)
        self.events.append("summary", summary, durable=True)
        return summary

    def endpoint(self) -> tuple[str, str] | None:
        """(node id, path) of the Unix socket on which processes of this node make the session's
        calls (``call`` and ``result``); None when there is none (the actor serves them all).
        Opened on the first ask."""
        from engine.state.store import default_host_dir

        with self.cv:
            if not self._socket_tried and self.ended is None:
                self._socket_tried = True
                try:
                    self._listener, path = wire.listen_on_node(default_host_dir().parent, "session")
                except OSError as exc:  # e.g. a path over the 107 bytes a Unix socket may have
                    _log.warning("session %s: no node socket (%s); calls come through the actor", self.job_id, exc)
                else:
                    self._endpoint = (ray.get_runtime_context().get_node_id(), path)
                    threading.Thread(target=self._accept, args=(self._listener,), name="session-socket",
                                     daemon=True).start()
            return self._endpoint

    def _accept(self, listener: socket.socket) -> None:
        with contextlib.suppress(OSError):  # closed when the session ends
            while True:
                connection, _ = listener.accept()
                threading.Thread(target=self._serve, args=(connection,), name="session-socket-caller",
                                 daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        """One caller's connection: ``(method, args)`` frames, ``call`` or ``result``, each answered
        with ``(ok, value or error)`` once it has run, one at a time. A caller that stopped waiting
        closes its connection; the call's answer is kept for ``result`` all the same."""
        with connection:
            while True:
                try:
                    method, args = wire.recv(connection)
                except Exception:  # closed by the caller, or a frame that did not unpickle
                    return
                self.socket_calls += 1
                try:
                    if method not in ("call", "result"):
                        raise ValueError(f"a session's socket makes calls and fetches results, not {method!r}")
                    reply = (True, getattr(self, method)(*args))
                except Exception as exc:
                    reply = (False, wire.sendable_error(exc))
                try:
                    wire.send(connection, reply)
                except OSError:
                    return

    def _close_socket(self) -> None:
        with self.cv:
            listener, self._listener = self._listener, None
            endpoint, self._endpoint = self._endpoint, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # the accepting thread wakes up and ends
            listener.close()
        if endpoint is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(endpoint[1])

    def close(self, reason: str = "closed by the tenant") -> dict[str, Any]:
        """End the session once the calls already submitted are answered."""
        with self.cv:
            while self.in_flight:
                self.cv.wait(timeout=1.0)
            if self.ended is None:
                self.ended = reason
            self.cv.notify_all()
            return {"closed": self.ended, "calls": self.calls}

    def call(self, seq: int, fn: str, args: dict[str, Any]) -> dict[str, Any]:
        """Call number ``seq`` of the session: ``fn`` (``session_calls.SESSION_CALLS``) with its
        JSON ``args``; its answer: ``result`` (JSON) and ``engine_ms``, the milliseconds from its
        turn to its result (what the call costs in the engine, as a preset job's driver would make
        it: scheduling and execution, without the transport or the JSON). SpecError: bad arguments
        (nothing was submitted; the number is used all the same); SessionClosed: the session ended
        first."""
        if fn == "close":
            return {"engine_ms": 0.0, "result": self.close()}
        try:
            role, kwargs = decode(fn, args)  # checked before its turn: refused at once, holding no one up
        except SpecError as exc:
            self._refuse(seq, exc)
            raise
        with self.cv:
            self._wait_turn(seq)
            self.in_flight.add(seq)
            self.last = started = time.monotonic()
            try:
                pending = self._submit(fn, role, kwargs)
            except BaseException as exc:
                self._answered(seq, exc)
                raise
            finally:
                self.next_seq += 1  # its turn is over, submitted or refused
                self._advance()
        try:
            value = pending() if callable(pending) else pending
            answer = {"engine_ms": (time.monotonic() - started) * 1e3, "result": encode(fn, value)}
        except BaseException as exc:
            with self.cv:
                self._answered(seq, exc)
            raise
        with self.cv:
            self._answered(seq, None, answer)
        return answer

    def result(self, seq: int, wait_s: float) -> dict[str, Any]:
        """The answer of call ``seq``, sent before (by ``call``), once it is there (as ``call``
        returns it), or the error it raised. TimeoutError: not yet, after ``wait_s``; SessionClosed: the session
        ended before the call came; LookupError: it came and its answer is no longer kept."""
        deadline = time.monotonic() + wait_s
        with self.cv:
            while seq not in self.answers:
                if seq < self.next_seq and seq not in self.in_flight:
                    raise LookupError(f"call {seq}'s answer is no longer kept (the last {KEEP_ANSWERS} are)")
                if self.ended is not None and seq >= self.next_seq:
                    raise SessionClosed(self.job_id, self.ended)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"call {seq} has not answered yet")
                self.cv.wait(timeout=left)
            ok, value = self.answers[seq]
        if ok:
            return value
        raise value

    def _answered(self, seq: int, exc: BaseException | None, out: dict[str, Any] | None = None) -> None:
        """Call ``seq`` is done: ``out``, or how it failed (``exc``); kept for ``result`` (the last
        ``KEEP_ANSWERS``). An engine fault ends the session. Holds the lock."""
        self.calls += 1
        self.last = time.monotonic()
        self.in_flight.discard(seq)
        self.answers[seq] = (exc is None, out if exc is None else exc)
        while len(self.answers) > KEEP_ANSWERS:
            self.answers.popitem(last=False)
        if exc is not None and is_engine_fault(exc) and self.ended is None:
            self.fault, self.ended = exc, f"engine fault: {type(exc).__name__}"
        self.cv.notify_all()

    def _refuse(self, seq: Any, exc: SpecError) -> None:
        """A call refused before its turn still uses its number: the calls after it do not wait
        for it (its answer is the error), unless that number is another call's already."""
        with self.cv:
            if type(seq) is int and seq >= self.next_seq and seq not in self.waiting | self.in_flight | self.refused:
                self.refused.add(seq)
                self.answers[seq] = (False, exc)
                self._advance()

    def _advance(self) -> None:
        """Past the numbers of refused calls. Holds the lock."""
        while self.next_seq in self.refused:
            self.refused.discard(self.next_seq)
            self.next_seq += 1
        self.cv.notify_all()

    def _wait_turn(self, seq: int) -> None:
        if type(seq) is not int or seq < self.next_seq or seq in self.waiting | self.refused:
            raise SpecError("seq", f"call numbers go up from 1 without repeats; {seq!r} was used or is invalid "
                                   f"(the next is {self.next_seq})")
        deadline = time.monotonic() + ORDER_WAIT_S
        self.waiting.add(seq)
        try:
            while self.ended is None and self.next_seq != seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SpecError("seq", f"call {seq} waited {ORDER_WAIT_S:g} s for call {self.next_seq}, "
                                           f"which never came")
                self.cv.wait(timeout=left)
        finally:
            self.waiting.discard(seq)
        if self.ended is not None:
            raise SessionClosed(self.job_id, self.ended)

    def _submit(self, fn: str, role: str | None, kwargs: dict[str, Any]) -> Any:
        """Hand the call to the scheduler (in turn order); what it returns is waited on outside the
        lock: a ``Future``'s ``result``, or a value for the calls that are the driver's own."""
        if fn == "create_model":
            assert role is not None
            if role in self.handles:
                raise SpecError("role", f"the session already has a {role} model")
            handle = self.client.create_model(self.job_id, role, self.spec.model or "",
                                              trainable=kwargs["trainable"], optimizer_config=kwargs["optimizer"])
            self.handles[role] = handle
            return {"role": role, "model": self.spec.model}
        if fn == "log_metrics":
            self.client.log_metrics(kwargs["step"], kwargs["values"])
            return {"step": kwargs["step"]}
        if fn == "export":
            return self._export
        if fn == "tokenize":  # special: as generate encodes a prompt; eos: a completion that ends
            tokenizer = self.client.tokenizer(self.spec.model or "")
            ids = [tokenizer.encode(text, add_special_tokens=kwargs["special"]) for text in kwargs["texts"]]
            return {"token_ids": [[*row, tokenizer.eos_token_id] if kwargs["eos"] else row for row in ids]}
        handle = self.handles.get(role or "")
        if handle is None:
            raise SpecError("role", f"the session has no {role} model yet (create_model first)")
        if fn == "generate" and "texts" in kwargs:
            tokenizer = self.client.tokenizer(handle)
            prompts = [tokenizer.encode(text) for text in kwargs["texts"]]
            future = handle.generate(prompts, kwargs["sampling"])
            return lambda: (prompts, future.result())
        return getattr(handle, fn)(**kwargs).result

    def _export(self) -> dict[str, Any]:
        """The policy's weights now, as a Hugging Face folder beside the event log (``final/``),
        downloadable as a preset job's final weights are."""
        from engine.models import resolve_model
        from engine.service.artifacts import export_hf

        handle = self.handles.get("policy")
        if handle is None:
            raise SpecError("role", "the session has no policy model to export")
        saved = handle.save_checkpoint("final").result()
        out = self.events.path.parent / "final"
        files = export_hf(Path(saved["path"]), resolve_model(self.spec.model or "", build_missing=False), out)
        self.events.append("artifact", {"name": "final", "path": str(out), "files": files}, durable=True)
        return {"files": files}
