"""The platform's central promise: sharing worker groups does not change what a job learns.

Two small jobs of different shapes run (a) each alone on a rollout group and a train group of its
own and (b) both at once on one shared rollout group and one shared train group, each holding a
single job's state at a time, so the scheduler interleaves their calls and every switch goes
through the StateManager (the rollout side's weights and the trainer's state are separate states
of one deployment there). Their ``metrics.jsonl`` files must be byte-identical between (a) and (b).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS
from engine.service.eventlog import read_events
from engine.service.runtime import JobRun, run_jobs, write_run_outputs
from engine.spec import GRPOConfig, JobSpec
from engine.workers.group import Swapping, WorkerGroup

BASE = JobSpec(task="arith", model="tiny-arith", steps=3, seed=0, rollout="torch", trainer="torch",
               grpo=GRPOConfig(prompts_per_step=16, samples_per_prompt=4, updates_per_step=2, eval_every=1,
                               eval_size=20, max_tokens=6))
DEVICES = 0.25
SPECS = {
    "a": BASE,
    "b": dataclasses.replace(BASE, seed=7, grpo=dataclasses.replace(BASE.grpo, prompts_per_step=8,
                                                                     samples_per_prompt=8, lr=5e-4)),
}


@pytest.fixture(scope="module")
def runs(ray_engine, plexrl_home, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mux")
    started: list[WorkerGroup] = []

    def pair(name: str, swapping: Swapping | None = None) -> list[WorkerGroup]:
        # a quarter device slot each: the session's other groups may hold slots of their own
        groups = [WorkerGroup.start(f"{name}-{side}", threads=1, data_dir=plexrl_home, swapping=swapping,
                                    devices_per_rank=DEVICES, serves=serves)
                  for side, serves in (("rollout", ROLLOUT_FUNCTIONS), ("train", TRAIN_FUNCTIONS))]
        started.extend(groups)
        return groups

    def run(mode: str, names: list[str], groups: list[WorkerGroup]) -> dict[str, list[dict]]:
        jobs = [JobRun(f"{name}-{mode}", SPECS[name], root / mode / name / "events.jsonl") for name in names]
        summaries = run_jobs(jobs, groups, poll_s=0.05)
        out = {}
        for name, job in zip(names, jobs, strict=True):
            write_run_outputs(job.events_path, job.events_path.parent, summaries[job.job_id])
            out[name] = read_events(job.events_path)
        return out

    try:
        alone = {}
        for name in SPECS:  # one after another, each on groups of its own
            dedicated = pair(f"mux-alone-{name}")
            alone |= run("alone", [name], dedicated)
            for g in dedicated:
                g.shutdown()
        shared_groups = pair("mux-shared", Swapping(max_resident=1))
        shared = run("shared", list(SPECS), shared_groups)
        import ray

        swaps = [ray.get(g.ranks[0].swap_stats.remote()) for g in shared_groups]
        yield {"root": root, "alone": alone, "shared": shared, "swaps": swaps}
    finally:
        for g in started:
            g.shutdown()


@pytest.mark.parametrize("name", list(SPECS))
def test_shared_metrics_are_byte_identical_to_running_alone(runs, name):
    alone = (runs["root"] / "alone" / name / "metrics.jsonl").read_bytes()
    shared = (runs["root"] / "shared" / name / "metrics.jsonl").read_bytes()
    assert alone.count(b"\n") == SPECS[name].steps
    assert shared == alone


def test_the_shared_group_really_interleaved_and_switched(runs):
    spans = {}
    for name, events in runs["shared"].items():
        usage = [e["data"] for e in events if e["kind"] == "usage"]
        assert usage
        assert {u["wpg"] for u in usage} == {"mux-shared-rollout", "mux-shared-train"}
        spans[name] = (min(u["start"] for u in usage), max(u["end"] for u in usage))
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1
    assert b0 < a1
    for swaps in runs["swaps"]:  # both groups switched jobs, and wrote the outgoing states
        assert swaps["in"] >= 2
        assert swaps["out"] >= 2


def test_every_call_yields_one_usage_record(runs):
    for events in runs["shared"].values():
        usage = [e["data"] for e in events if e["kind"] == "usage"]
        calls = [(u["call"], u["wpg"]) for u in usage]  # a sync holds both groups: a record on each
        assert len(calls) == len(set(calls))
        for u in usage:
            assert u["end"] >= u["start"]
            assert u["devices"] == DEVICES
        for e in events:  # on the wall clock (Unix seconds): logged just after the call ended
            if e["kind"] == "usage":
                assert e["ts"] - 120 < e["data"]["start"] <= e["data"]["end"] <= e["ts"] + 0.5
            assert u["setup_s"] >= 0
        assert {u["fn"] for u in usage} >= {"create", "generate", "forward_backward", "optim_step", "sync_weights"}


def test_a_split_deployment_keeps_its_trainer_and_rollout_states_apart(ray_engine, plexrl_home, tiny_model_dir):
    """One deployment lives on two groups (trainer and rollout side). Evicting both sides must
    store two states: were the rollout side's weights (last synced) written over the trainer's
    (updated since), the trainer would come back with stale weights."""

    from engine.client import Batch, Client, OptimizerConfig
    from engine.scheduler.router import Router

    groups = [WorkerGroup.start(f"split-{side}", threads=1, data_dir=plexrl_home, devices_per_rank=DEVICES,
                                swapping=Swapping(max_resident=1, write_behind=False), serves=serves)
              for side, serves in (("rollout", ROLLOUT_FUNCTIONS), ("train", TRAIN_FUNCTIONS))]
    try:
        client = Client(Router(groups))
        a = client.create_model("split-a", "policy", "tiny-arith", trainable=True,
                                optimizer_config=OptimizerConfig(lr=1e-2))
        batch = Batch(prompts=[[5, 6, 7]] * 4, completions=[[8, 9, 1]] * 4, advantages=np.ones(4))

        def train_step() -> None:
            a.forward_backward(batch, "grpo").result()
            a.optim_step().result()

        train_step()
        a.sync_weights().result()  # the rollout side now holds the weights after one step
        train_step()  # the trainer moves on
        before = a.forward(batch).result().logprobs
        client.create_model("split-b", "policy", "tiny-arith", trainable=True)  # evicts a on both groups
        after = a.forward(batch).result().logprobs  # a's trainer swapped back in
        assert np.array_equal(after, before)
    finally:
        for g in groups:
            g.shutdown()
