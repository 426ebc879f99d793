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


class ModelNotFound(EngineError):
    """A model preset or directory does not exist or is not a usable Hugging Face model."""
