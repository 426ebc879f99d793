"""Training jobs: specs, lifecycle, metrics and events, and the bridge to the engine."""
