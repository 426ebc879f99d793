"""Where the control plane's actors go: on the node of the process that starts them."""

from __future__ import annotations

from typing import Any


def here() -> Any:
    """A scheduling strategy for an actor that must live on this process's node (the engine
    service, the scheduler, the jobs' drivers: the control plane, which a worker node's loss must
    not take with it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
