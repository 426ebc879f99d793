"""Errors the engine raises on bad input; each names what was wrong so an edge can report it."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of errors caused by the caller, not by a bug (CLI: one line, exit status 2)."""


class SpecError(EngineError, ValueError):
    """A job spec or config field is invalid. ``field`` names it (for HTTP 400 field errors)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # survives pickling (a Ray actor raising it to its caller)
        return type(self), (self.field, self.message)


class TooLarge(SpecError):
    """A field over a size limit (rows of a batch, tokens of a row): ``limit`` is the most allowed
    (HTTP 413, naming it)."""

    def __init__(self, field: str, message: str, limit: int):
        super().__init__(field, message)
        self.limit = limit

    def __reduce__(self):
        return type(self), (self.field, self.message, self.limit)


class ModelInvalid(EngineError, ValueError):
    """A model folder the engine does not take (``engine.models.check``); the message names the
    file or tensor and what is wrong."""


class StateError(Exception):
    """Base of the StateManager store's errors; every one leaves the store as it was before the call.
    Here, not in ``engine.state.store``, so a worker group's handle catches them without torch."""


class UnknownKey(StateError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class CliError(EngineError):
    """Bad command-line input; reported as one line with exit status 2."""


class DatasetError(ValueError):
    """A dataset file is not usable; the message names the line (``line 7: ...``) when it can."""


class ModelNotFound(EngineError):
    """A model preset or directory does not exist or is not a usable Hugging Face model."""


class UnknownService(LookupError):
    """The Ray cluster runs no engine service (``plexrl engine start`` starts one)."""


class UnknownJob(KeyError):
    """No job with that id was ever submitted to this engine."""


class SessionClosed(EngineError):
    """A call came for a session that has ended (closed by its tenant, idle too long, failed,
    cancelled): nothing was run (HTTP 409)."""

    def __init__(self, job: str, why: str):
        super().__init__(f"session {job} is closed: {why}")
        self.job, self.why = job, why

    def __reduce__(self):  # survives pickling (a Ray actor raising it to its caller)
        return type(self), (self.job, self.why)


class SessionPending(EngineError):
    """A call came for a session still queued for worker groups: nothing was sent (send it again)."""


class EngineFault(RuntimeError):
    """A part of the engine died under a job (a worker rank, the scheduler, the job's driver), not
    the job's own doing: the engine service restarts what died and resumes the job from its last
    checkpoint (``engine.recovery``)."""


def is_engine_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says a part of the engine died under a job (the job recovers), not that the
    job itself went wrong (it fails): an ``EngineFault``, a dead Ray actor, worker or node, a result
    lost with the process that held it (a rank's bulky result, owned by the rank, whose node went
    away before the driver fetched it), a broken scheduler socket."""
    from ray.exceptions import NodeDiedError, ObjectLostError, RayActorError, WorkerCrashedError

    from engine.support.wire import Closed

    return isinstance(exc, (EngineFault, RayActorError, ObjectLostError, NodeDiedError, WorkerCrashedError, Closed))


def fault_reason(exc: BaseException) -> str:
    """One line saying what went wrong: the error itself, not Ray's wrappers and their tracebacks."""
    from ray.exceptions import OwnerDiedError, RayTaskError

    while isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    if isinstance(exc, OwnerDiedError):  # its own text: an object id and a debugging tip
        return f"{type(exc).__name__}: a result was lost with the process that held it (its worker or node died)"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def as_fault(exc: BaseException) -> EngineFault:
    """``exc`` (an engine fault, ``is_engine_fault``) as the ``EngineFault`` a job's driver raises for the
    engine service to recover, its message the one line of ``fault_reason``."""
    return exc if isinstance(exc, EngineFault) else EngineFault(fault_reason(exc))
