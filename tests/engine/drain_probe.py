"""Run by ``test_recovery``: a Ray cluster of three nodes on this machine (a head node with no
device slots, where the platform's process runs, and two worker nodes of one device slot each, a
node group each) with the engine service on it. A job runs; once it has logged step 1 it is paused
(``pause_after_step``) and an admin drains the worker node its groups are on
(``EngineClient.drain``, what ``plexrl engine drain`` calls): the job, resumed, must go on on the
other node. Prints one JSON object: the job's events, the node drained, the drain's answer, where
the groups were after, the nodes as the snapshot lists them, and a second job's status, submitted
after the drain while the other node is busy (``after``: its spec; the first job's, one step, by
default). A process of its own: the test session's Ray is
another cluster. ``PLEXRL_HOME`` names where the presets are built."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine.control import EngineClient
from engine.spec import JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, pause_after_step, wait_for, worker_nodes


def main(data_dir: Path, spec: dict, after_spec: dict | None = None) -> None:
    with worker_nodes(2) as (_, workers):
        # one job a pair: a second job needs the other node
        client = EngineClient(data_dir=data_dir, config=ServiceConfig(devices_per_group=0.5, threads=1,
                                                                      job_demand=1.0, group_load_limit=1.0))
        try:
            client.submit_job("mn-drain", JobSpec.from_dict(spec))
            pause_after_step(client, "mn-drain", 1)
            (node,) = {w["node"] for w in client.cluster_snapshot()["wpgs"]}
            answer = client.drain(node[:10])  # a prefix names it
            # the drained node takes none
            client.submit_job("mn-after", JobSpec.from_dict(after_spec or {**spec, "steps": 1}))
            during = client.cluster_snapshot()
            after_status = client.status("mn-after")
            client.resume("mn-drain")
            events = wait_for(client, "mn-drain", finished, timeout=300)
            after = wait_for(client, "mn-after", finished, timeout=300)
            print(json.dumps({
                "drained": node, "answer": answer, "workers": [w.node_id for w in workers],
                "nodes_during": during["nodes"], "wpg_nodes_during": sorted({w["node"] for w in during["wpgs"]}),
                "after_queued": after_status,
                "after_states": [e["data"]["state"] for e in after if e["kind"] == "state"], "events": events,
                "after_events": after,
            }))
        finally:
            client.shutdown()

if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
