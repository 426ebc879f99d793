"""A job that continues another's run (issue 34): from its final weights (the exported Hugging Face
folder as its model) or from one of its checkpoints (``init_from``, exported to a folder by a task
of its own at start). Either way its first, initial evaluation is the parent's evaluation of the
same weights, on the same held-out problems, with the same backends."""

from __future__ import annotations

import dataclasses

import pytest

from engine.control import EngineClient
from engine.spec import GRPOConfig, JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, metrics, states, wait_for

PARENT = JobSpec(task="arith", model="tiny-arith", steps=4, seed=0, rollout="torch", trainer="torch",
                 grpo=GRPOConfig(prompts_per_step=16, samples_per_prompt=4, updates_per_step=2, eval_every=2,
                                 eval_size=200, temperature=1.0, lr=1e-3, lr_schedule="constant",
                                 checkpoint_every=2))


@pytest.fixture(scope="module")
def engine(ray_engine, plexrl_home, tiny_model_dir):
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=0.25, threads=1))
    yield client
    client.shutdown()


def _run(engine: EngineClient, job: str, spec: JobSpec) -> list[dict]:
    engine.submit_job(job, spec)
    events = wait_for(engine, job, finished, timeout=300)
    assert states(events)[-1] == "succeeded", events[-3:]
    return events


def _initial(events: list[dict]) -> float:
    return next(e["data"]["initial_accuracy"] for e in events if e["kind"] == "summary")


def test_a_continued_job_starts_from_the_parents_final_weights_or_checkpoint(engine):
    parent = _run(engine, "cont-parent", PARENT)
    evals = {m["step"]: m["eval_accuracy"] for m in metrics(parent) if "eval_accuracy" in m}
    # the run moved away from the base: a child that started from the base would not match
    assert _initial(parent) not in (evals[2], evals[4]), (_initial(parent), evals)

    final = next(e["data"]["path"] for e in parent if e["kind"] == "artifact" and e["data"]["name"] == "final")
    child = _run(engine, "cont-final", dataclasses.replace(PARENT, model=final, steps=1, seed=5))
    assert _initial(child) == evals[4]  # its first evaluation is the parent's last

    checkpoint = [e["data"] for e in parent if e["kind"] == "checkpoint"][-1]
    assert checkpoint["step"] == 2
    child = _run(engine, "cont-step2", dataclasses.replace(PARENT, init_from=checkpoint["path"], steps=1, seed=5))
    assert _initial(child) == evals[2]
    assert any("starting from the weights of checkpoint" in e["data"].get("message", "") for e in child
               if e["kind"] == "log")


def test_a_missing_checkpoint_fails_the_job_with_the_reason(engine, tmp_path):
    engine.submit_job("cont-missing", dataclasses.replace(PARENT, init_from=str(tmp_path / "gone"), steps=1))
    events = wait_for(engine, "cont-missing", finished, timeout=120)
    assert states(events)[-1] == "failed"
    reason = [e["data"] for e in events if e["kind"] == "state"][-1]["reason"]
    assert "is not a checkpoint folder" in reason
