"""Algorithm code (GRPO). Uses only the function API (``engine.client``), its spec and the tasks."""
