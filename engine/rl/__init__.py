"""Algorithm code (GRPO), tasks and rewards. Uses only the function API in ``engine.client``."""
