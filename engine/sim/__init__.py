"""Trace-driven cluster simulator on the live scheduler\x27s code (DESIGN section 4, Simulator)."""
