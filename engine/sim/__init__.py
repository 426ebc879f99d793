"""Trace-driven cluster simulator on the live scheduler's code (docs/architecture.md §3)."""
