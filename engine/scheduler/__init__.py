"""The scheduler: pure, deterministic policies over explicit state (no Ray inside).

The live engine applies their decisions to Ray; the simulator to its model.
"""
