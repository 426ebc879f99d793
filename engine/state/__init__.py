"""The StateManager: job model state in device, host and disk tiers under canonical keys."""
