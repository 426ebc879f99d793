"""Run by ``test_recovery``: a Ray cluster of three nodes on this machine (a head node with no
device slots, where the platform's process runs, and two worker nodes of one device slot each, a
node group each) with the engine service on it. A job runs; once it has logged step 1 it is paused
(``pause_after_step``), the worker node its groups are on is removed (its raylet and every process
on it die), and the job resumed. Prints one JSON object: the job's events, the node removed, where
the groups and the control plane were before and after. A process of its own: the test session's
Ray is another cluster. ``PLEXRL_HOME`` names where the ``tiny-arith`` preset is built."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import ray

from engine.control import EngineClient
from engine.spec import JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, pause_after_step, wait_for, worker_nodes


def main(data_dir: Path, spec: dict) -> None:
    with worker_nodes(2) as (cluster, workers):
        head = ray.get_runtime_context().get_node_id()
        client = EngineClient(data_dir=data_dir, config=ServiceConfig(devices_per_group=0.5, threads=1,
                                                                      max_recoveries=2))
        try:
            client.submit_job("mn-fault", JobSpec.from_dict(spec))
            pause_after_step(client, "mn-fault", 1)
            before = client.cluster_snapshot()
            (node,) = {w["node"] for w in before["wpgs"]}  # a job's groups share one node group
            cluster.remove_node(next(w for w in workers if w.node_id == node))
            lost_at = time.monotonic()
            client.resume("mn-fault")  # its next call meets the lost node
            events = wait_for(client, "mn-fault", finished, timeout=300)
            after = client.cluster_snapshot()
            print(json.dumps({
                "head": head, "removed": node, "workers": [w.node_id for w in workers],
                "control_before": before["control_node"], "control_after": after["control_node"],
                "wpg_nodes_after": sorted({w["node"] for w in after["wpgs"]}),
                "recovered_in_s": time.monotonic() - lost_at, "events": events,
            }))
        finally:
            client.shutdown()

if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
