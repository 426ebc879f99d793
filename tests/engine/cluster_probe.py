"""Run by ``test_cluster_view``: a Ray cluster of several nodes on this machine (a head node with no
device slots, two nodes of node group "a" named by resource, one of node group "b" named by label),
read as the engine reads it: before and after a worker group starts, a tensor-parallel group is
placed on the node ``choose_nodes`` picks (its ranks meet there), a group too large for any node is
refused, a group is released, two nodes' StateManagers keep their disk tiers apart, a node joins,
and a node dies. Prints one JSON object. A process of
its own: the test session's Ray is another cluster."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from engine.service.cluster import choose_nodes, held_slots, node_usage, ray_free_devices, read_nodes
from engine.state.manager import state_manager
from engine.workers.group import PlacementError, WorkerGroup


def snapshot(groups: list[WorkerGroup]) -> list[dict]:
    return node_usage(read_nodes(), held_slots(groups))


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not change in time")
        time.sleep(0.2)


def tensor_parallel(data_dir: Path, group: WorkerGroup) -> dict:
    """A Megatron TP=2 group (two ranks of one slot, which meet in torch.distributed) on the node
    ``choose_nodes`` picks; a group no node holds; the TP group's release."""
    out = {"addresses": {n.id: n.address for n in read_nodes()}}
    (target,) = choose_nodes(node_usage(read_nodes(), held_slots([group]), ray_free_devices()), [2.0])
    tp = WorkerGroup.start("probe-tp", "megatron", world_size=2, threads=1, data_dir=data_dir, devices_per_rank=1,
                           node=target)
    out.update(tp_target=target, tp_nodes=list(tp.nodes), tp_rendezvous=tp.rendezvous)
    out["with_tp"] = snapshot([group, tp])
    try:
        WorkerGroup.start("probe-big", "torch", world_size=1, threads=1, data_dir=data_dir, devices_per_rank=3,
                          place_timeout_s=3)
    except PlacementError as exc:
        out["too_big"] = str(exc)
    out["big_left"] = [pg["state"] for pg in ray.util.placement_group_table().values()
                       if pg["name"] == "wpg:probe-big" and pg["state"] != "REMOVED"]
    # pinned where the caller says, whatever Ray would pick: the one-slot node of group "b"
    b = next(n.id for n in read_nodes() if n.node_group == "b")
    pinned = WorkerGroup.start("probe-pin", "torch", world_size=1, threads=1, data_dir=data_dir,
                               devices_per_rank=0.5, node=b)
    out.update(b=b, pinned_nodes=list(pinned.nodes))
    pinned.shutdown()
    tp.shutdown()
    wait_for(lambda: ray_free_devices().get(target, 0.0) == 2.0)
    out["tp_released"] = ray_free_devices().get(target, 0.0)
    return out


def restart_manager(data_dir: Path, node: str):
    """Stop ``node``'s StateManager and start another (which recovers from its disk tier)."""
    manager = state_manager(data_dir, node_id=node)
    ray.get(manager.close.remote())
    ray.kill(manager, no_restart=True)
    wait_for(lambda: not _alive(f"state:{node[:12]}"))
    manager = state_manager(data_dir, node_id=node)
    ray.get(manager.pid.remote())
    return manager


def _alive(name: str) -> bool:
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def disk_tiers(data_dir: Path, a: str, b: str) -> dict:
    """StateManagers of nodes ``a`` and ``b`` on one data directory (storage the nodes share): a
    file ``a``'s manager has not recorded yet (a materialize under way) survives ``b``'s recovery,
    and goes at ``a``'s own."""
    roots = {n: ray.get(state_manager(data_dir, node_id=n).root.remote()) for n in (a, b)}
    stray = Path(roots[a]) / "blobs" / "u-in-flight.safetensors"
    stray.write_bytes(b"written by a materialize under way")
    restart_manager(data_dir, b)
    kept = stray.exists()
    restart_manager(data_dir, a)
    return {"roots": roots, "stray_kept_by_other": kept, "stray_after_own": stray.exists()}


@contextlib.contextmanager
def local_cluster(*nodes: dict) -> Iterator[tuple[Cluster, list]]:
    """A Ray cluster of several nodes on this machine: a head node with no device slot, then
    ``nodes`` (``Cluster.add_node`` arguments besides one CPU each), this process connected to it
    (namespace "probe": the StateManagers are detached actors); shut down on the way out."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    added = [cluster.add_node(num_cpus=1, **node) for node in nodes]
    ray.init(address=cluster.address, log_to_driver=False, namespace="probe")
    try:
        cluster.wait_for_nodes()
        yield cluster, added
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(data_dir: Path) -> None:
    nodes = ({"resources": {"device": 2, "node_group:a": 1}}, {"resources": {"device": 2, "node_group:a": 1}},
             {"resources": {"device": 1}, "labels": {"plexrl.node_group": "b"}})
    with local_cluster(*nodes) as (cluster, (a1, _, _)):
        out = {"head": ray.get_runtime_context().get_node_id(), "a1": a1.node_id, "start": snapshot([])}
        group = WorkerGroup.start("probe", "torch", world_size=1, threads=1, data_dir=data_dir, devices_per_rank=2)
        out["wpg_nodes"] = list(group.nodes)
        out["placed"] = snapshot([group])
        out.update(tensor_parallel(data_dir, group))
        out["disk"] = disk_tiers(data_dir, out["tp_target"], out["b"])
        joined = cluster.add_node(num_cpus=1, resources={"device": 4, "node_group:b": 1})
        wait_for(lambda: any(n.id == joined.node_id for n in read_nodes()))
        out["joined"] = joined.node_id
        out["after_join"] = snapshot([group])
        cluster.remove_node(a1)
        wait_for(lambda: all(n.id != a1.node_id for n in read_nodes()))
        out["after_loss"] = snapshot([group])
        print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
