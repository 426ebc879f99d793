"""Run by ``test_cluster_view``: a Ray cluster of several nodes on this machine (a head node with no
device slots, two nodes of node group "a" named by resource, one of node group "b" named by label),
read as the engine reads it: before and after a worker group starts, a node joins, and a node dies.
Prints one JSON object. A process of its own: the test session's Ray is another cluster."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from engine.service.cluster import held_slots, node_usage, read_nodes
from engine.workers.group import WorkerGroup


def snapshot(groups: list[WorkerGroup]) -> list[dict]:
    return node_usage(read_nodes(), held_slots(groups))


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not change in time")
        time.sleep(0.2)


def main(data_dir: Path) -> None:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    a1 = cluster.add_node(num_cpus=1, resources={"device": 2, "node_group:a": 1})
    cluster.add_node(num_cpus=1, resources={"device": 2, "node_group:a": 1})
    cluster.add_node(num_cpus=1, resources={"device": 1}, labels={"plexrl.node_group": "b"})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        out = {"head": ray.get_runtime_context().get_node_id(), "a1": a1.node_id, "start": snapshot([])}
        group = WorkerGroup.start("probe", "torch", world_size=1, threads=1, data_dir=data_dir, devices_per_rank=2)
        out["wpg_nodes"] = list(group.nodes)
        out["placed"] = snapshot([group])
        joined = cluster.add_node(num_cpus=1, resources={"device": 4, "node_group:b": 1})
        wait_for(lambda: any(n.id == joined.node_id for n in read_nodes()))
        out["joined"] = joined.node_id
        out["after_join"] = snapshot([group])
        cluster.remove_node(a1)
        wait_for(lambda: all(n.id != a1.node_id for n in read_nodes()))
        out["after_loss"] = snapshot([group])
        print(json.dumps(out))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
