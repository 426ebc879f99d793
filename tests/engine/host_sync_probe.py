"""Run by ``test_state_swap_backends``: a host-tier weight sync across two Ray nodes on this machine.

A torch trainer group (it swaps) on one node, a vLLM engine (it swaps) on the other, a Router with
``sync="host"``: a Llama policy trains a few steps and syncs, which writes the trained weights into
the *rollout node's* StateManager over the network while holding the trainer group only; the engine
then reloads them before its next generate. Prints one JSON object: the groups' nodes, the WPGs
the sync's usage names, the greedy answers before and after, what transformers answers on the
trainer's weights, and the rollout engine's counters. A process of its own: the test session's
Ray is another cluster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
import torch

from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS, Batch, OptimizerConfig, SamplingParams
from engine.scheduler.router import Router
from engine.state.layout import gather_shards
from engine.workers.group import Swapping, WorkerGroup
from engine.workers.sampling import sample
from tests.engine.cluster_probe import local_cluster
from tests.modelfiles import build_tiny_model

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
MAX_TOKENS = 6
JOB = ("host-sync", "policy")


def greedy_by_transformers(model_dir: Path, weights: dict[str, torch.Tensor]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(weights, strict=True)
    return [sample(model, [p], max_tokens=MAX_TOKENS, temperature=0.0, eos_id=1, pad_id=0, generator=None)[0][0]
            for p in PROMPTS]


def main(data_dir: Path) -> None:
    model_dir = build_tiny_model(data_dir / "llama", "llama", tied=False, seed=4)
    with local_cluster({"resources": {"device": 1}}, {"resources": {"device": 1}}) as (_, (train_node, rollout_node)):
        trainer = WorkerGroup.start("probe-train", "torch", threads=1, data_dir=data_dir, devices_per_rank=1,
                                    swapping=Swapping(max_resident=1), serves=TRAIN_FUNCTIONS,
                                    node=train_node.node_id)
        rollout = WorkerGroup.start("probe-rollout", "vllm", threads=1, data_dir=data_dir, devices_per_rank=1,
                                    swapping=Swapping(max_resident=1), serves=ROLLOUT_FUNCTIONS,
                                    node=rollout_node.node_id)
        router = Router([trainer, rollout])
        router.create(*JOB, model_dir, trainable=True, optimizer=OptimizerConfig(lr=3e-2))
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)

        def generate() -> list[list[int]]:
            return [c.token_ids for c in router.call(*JOB, "generate", {"prompts": PROMPTS, "sampling": greedy})
                    .result()]

        out = {"train_node": train_node.node_id, "rollout_node": rollout_node.node_id,
               "trainer_nodes": list(trainer.nodes), "rollout_nodes": list(rollout.nodes),
               "sync": router.sync_of(router.placement[JOB]), "trainer": trainer.name, "rollout": rollout.name}
        out["before"] = generate()
        batch = Batch(prompts=PROMPTS, completions=[[20, 21, 1]] * len(PROMPTS), advantages=torch.ones(len(PROMPTS)))
        for _ in range(3):  # not waited for: the sync must see every step submitted before it
            router.call(*JOB, "forward_backward", {"batch": batch, "loss": "grpo", "loss_config": {}})
            router.call(*JOB, "optim_step", {})
        usage: list[dict] = []
        out["synced"] = router.call(*JOB, "sync_weights", {}, on_usage=usage.extend).result()
        out["sync_wpgs"] = sorted({u["wpg"] for u in usage})
        out["after"] = generate()
        parts = ray.get(trainer.ranks[0].export_weights.remote(JOB, None))
        trained = {name: gather_shards([(t, spec)]) for name, t, spec in parts}
        out["trained_bytes"] = sum(t.numel() * t.element_size() for t in trained.values())
        out["reference"] = greedy_by_transformers(model_dir, trained)
        stats = ray.get(rollout.ranks[0].stats.remote())
        out["published"], out["reloads"] = stats["published"], stats["swaps"]
        print(json.dumps(out))

if __name__ == "__main__":
    main(Path(sys.argv[1]))
