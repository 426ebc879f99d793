"""Job models (spec, lifecycle, metrics, events) come with the jobs issue."""
