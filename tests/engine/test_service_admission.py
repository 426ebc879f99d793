"""Admission on the engine service: jobs of two model configurations (the ``tiny-arith`` and
``tiny-arith-tools`` presets, another vocabulary) submitted together on vLLM rollout both run and
succeed, each on a vLLM group of its own configuration; a job whose group does not fit on the
node's free device slots waits ``queued`` with its position and reason and holds no driver, and
starts when a finished job's group, now unused, is released for it. Real Ray actors, real vLLM."""

from __future__ import annotations

import pytest
import ray

from engine.control import EngineClient
from engine.spec import GRPOConfig, JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, states, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GRPO = GRPOConfig(prompts_per_step=4, samples_per_prompt=4, updates_per_step=1, eval_every=2, eval_size=4,
                  max_tokens=6, temperature=1.0)
ARITH = JobSpec(task="arith", model="tiny-arith", steps=2, seed=1, rollout="vllm", trainer="torch", grpo=GRPO)
TOOLS = JobSpec(task="arith-tools", model="tiny-arith-tools", steps=2, seed=1, rollout="vllm", trainer="torch",
                grpo=GRPO)


@pytest.fixture(scope="module")
def slots(worker_group) -> float:
    """Device slots a group takes here: half of those free, so the torch trainer and one vLLM group
    fill the node. The session's worker group (not the engine's) holds one of the node's two: the
    service must count it as taken, as Ray does."""
    free = ray.available_resources().get("device", 0)
    assert 0 < free < sum(n["Resources"].get("device", 0) for n in ray.nodes() if n["Alive"])
    return free / 2


@pytest.fixture(scope="module")
def engine(slots, plexrl_home, tiny_model_dir, tiny_tools_model_dir):
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=slots, threads=1))
    yield client
    client.shutdown()


def generate_wpgs(events: list[dict]) -> set[str]:
    return {e["data"]["wpg"] for e in events if e["kind"] == "usage" and e["data"]["fn"] == "generate"}


def test_two_model_configurations_each_get_a_vllm_group_and_the_one_that_does_not_fit_waits(engine, slots):
    first = engine.submit_job("adm-arith", ARITH)
    assert first["active"]
    second = engine.submit_job("adm-tools", TOOLS)
    assert second["state"] == "queued"
    assert not second["active"]
    assert second["position"] == 1
    assert f"waiting for {slots:g} device slots for its vllm rollout worker group" in second["reason"]
    assert ray.get_actor("driver:adm-arith", namespace="plexrl")  # the running job's driver
    with pytest.raises(ValueError, match="driver:adm-tools"):
        ray.get_actor("driver:adm-tools", namespace="plexrl")  # a queued job holds no driver
    snap = engine.cluster_snapshot()
    assert [q["job"] for q in snap["queued"]] == ["adm-tools"]
    assert sorted((w["side"], w["backend"]) for w in snap["wpgs"]) == [("rollout", "vllm"), ("train", "torch")]

    arith = wait_for(engine, "adm-arith", finished, timeout=300)
    tools = wait_for(engine, "adm-tools", finished, timeout=300)
    assert states(arith)[-1] == "succeeded"
    assert states(tools)[-1] == "succeeded"
    assert states(tools)[:2] == ["queued", "running"]  # it started once the first job's group was released
    (arith_group,) = generate_wpgs(arith)
    (tools_group,) = generate_wpgs(tools)
    assert arith_group != tools_group
    assert arith_group.startswith("vllm-rollout-")
    assert tools_group.startswith("vllm-rollout-")
    names = {w["name"] for w in engine.cluster_snapshot()["wpgs"]}
    assert tools_group in names
    assert arith_group not in names  # released to make room


def test_cancelling_a_queued_job_ends_it_without_ever_starting_it(engine):
    engine.submit_job("adm-hold", ARITH)  # the vLLM group of tiny-arith again, in place of tiny-arith-tools'
    waiting = engine.submit_job("adm-cancel", TOOLS)
    assert waiting["state"] == "queued"
    done = engine.cancel("adm-cancel", reason="not needed")
    assert (done["state"], done["reason"], done["active"]) == ("cancelled", "not needed", False)
    assert "position" not in done
    assert engine.cluster_snapshot()["queued"] == []
    assert states(wait_for(engine, "adm-hold", finished, timeout=300))[-1] == "succeeded"
