"""The live engine's admission rounds (``engine.service.placing``) on tables: the placer's policy
on nodes as Ray reports them, the engine's running groups and jobs, and its queue."""

from __future__ import annotations

import pytest

from engine.scheduler.admission import AdmissionPolicy, Demand
from engine.service.placing import LiveGroup, admission_round

TORCH = (("train", "torch", 1, ""), ("rollout", "torch", 1, ""))
ARITH = (("train", "torch", 1, ""), ("rollout", "vllm", 1, "tiny-arith"))
TOOLS = (("train", "torch", 1, ""), ("rollout", "vllm", 1, "tiny-arith-tools"))
FCFS = AdmissionPolicy(limit=1.3, slowdown_bound=1.5, backfill=False, spread_alone=False)


def nodes(*spec: tuple[str, str, float, float], held: dict[str, float] | None = None) -> list[dict]:
    """usage rows: (id, node group, devices, free)."""
    held = held or {}
    return [{"id": i, "node_group": g, "devices": d, "free_devices": f, "held_devices": held.get(i, 0.0)}
            for i, g, d, f in spec]


def decide(usage, waiting, *, groups=(), running=None, policy=FCFS, size=1.0, demand=0.3):
    return admission_round(usage, list(groups), running or {}, waiting, group_devices=size,
                           demand=Demand(demand, demand), policy=policy)


def test_jobs_of_one_kind_fill_a_pair_to_the_load_limit_then_the_next_waits_with_the_reason():
    out = decide(nodes(("n1", "n1", 2, 2)), [(f"j{i}", TORCH) for i in range(5)])
    assert [a.job for a in out.admitted] == ["j0", "j1", "j2", "j3"]  # 4 x 0.3 <= 1.3 < 5 x 0.3
    first = out.admitted[0].groups
    assert [(k[0], node) for k, _, node in first] == [("train", "n1"), ("rollout", "n1")]
    refs = {ref for _, ref, _ in first}
    for later in out.admitted[1:]:
        assert {ref for _, ref, _ in later.groups} == refs  # they join the pair the first formed
        assert all(node == "" for _, _, node in later.groups)
    assert out.reasons == {"j4": "waiting for 2 device slots for its torch train, torch rollout worker group(s), "
                                 "1 on one node each: 0 of 2 free; its torch train, torch rollout group(s) are "
                                 "full (jobs' demands sum to the limit 1.3)"}


def test_a_full_pair_gets_a_second_one_on_another_node():
    usage = nodes(("n1", "n1", 2, 2), ("n2", "n2", 2, 2), ("n3", "n3", 2, 2))
    out = decide(usage, [(f"j{i}", TORCH) for i in range(8)])
    assert len(out.admitted) == 8
    assert not out.reasons
    formed = [(a.job, node) for a in out.admitted for _, _, node in a.groups if node]
    assert formed == [("j0", "n1"), ("j0", "n1"), ("j4", "n2"), ("j4", "n2")]


def test_running_groups_are_joined_and_counted_by_their_jobs_demands():
    usage = nodes(("n1", "n1", 2, 0), held={"n1": 2})
    groups = [LiveGroup("torch-train", TORCH[0], "n1", 1.0), LiveGroup("torch-rollout", TORCH[1], "n1", 1.0)]
    running = {f"r{i}": ["torch-train", "torch-rollout"] for i in range(3)}
    out = decide(usage, [("a", TORCH), ("b", TORCH)], groups=groups, running=running)
    assert [(a.job, a.groups) for a in out.admitted] == [("a", ((TORCH[0], "torch-train", ""),
                                                                (TORCH[1], "torch-rollout", "")))]
    assert "group(s) are full" in out.reasons["b"]


def test_idle_groups_count_free_and_two_model_configurations_share_a_trainer_not_a_vllm_group():
    usage = nodes(("n1", "n1", 2, 0.5), held={"n1": 1.5})
    groups = [LiveGroup("torch-train", ARITH[0], "n1", 0.5), LiveGroup("vllm-rollout-tiny-arith", ARITH[1], "n1", 0.5),
              LiveGroup("vllm-rollout-old", ("rollout", "vllm", 1, "old"), "n1", 0.5)]  # idle: nobody uses it
    out = decide(usage, [("tools", TOOLS)], groups=groups,
                 running={"arith": ["torch-train", "vllm-rollout-tiny-arith"]}, size=0.5)
    (admitted,) = out.admitted
    assert admitted.groups[0] == (TOOLS[0], "torch-train", "")
    key, _, node = admitted.groups[1]
    assert (key, node) == (TOOLS[1], "n1")  # a new vLLM group where the idle one is (the engine releases it)


def test_a_job_no_node_could_hold_waits_with_its_reason_and_does_not_hold_the_queue():
    out = decide(nodes(("n1", "n1", 1, 1)), [("big", TORCH), ("small", TORCH)], size=0.5)
    assert [a.job for a in out.admitted] == ["big", "small"]
    out = decide(nodes(("n1", "n1", 1, 1)), [("big", TORCH), ("small", TORCH)], size=2.0)
    assert not out.admitted
    assert "no node group can hold its worker groups (2 device slots each" in out.reasons["big"]
    assert "no node group can hold" in out.reasons["small"]


def test_the_first_job_that_does_not_fit_holds_the_later_ones():
    groups = [LiveGroup("vllm-rollout-tiny-arith", ARITH[1], "n1", 0.5), LiveGroup("torch-train", ARITH[0], "n1", 0.5)]
    running = {"arith": ["torch-train", "vllm-rollout-tiny-arith"]}
    usage = nodes(("n1", "n1", 2, 0), held={"n1": 1.0})
    out = decide(usage, [("tools", TOOLS), ("arith2", ARITH)], groups=groups, running=running, size=0.5)
    assert not out.admitted  # arith2 would fit on arith's groups, but tools came first
    assert out.reasons["tools"].startswith("waiting for 0.5 device slots for its vllm rollout worker group(s)")
    assert out.reasons["arith2"] == "behind tools in the queue"


def test_with_spread_a_job_alone_in_the_queue_gets_a_pair_of_its_own_where_slots_are_free():
    usage = nodes(("n1", "n1", 4, 2), held={"n1": 2})
    groups = [LiveGroup("torch-train", TORCH[0], "n1", 1.0), LiveGroup("torch-rollout", TORCH[1], "n1", 1.0)]
    running = {"r": ["torch-train", "torch-rollout"]}
    spread = AdmissionPolicy(limit=1.3, slowdown_bound=1.5, backfill=False, spread_alone=True)
    out = decide(usage, [("a", TORCH)], groups=groups, running=running, policy=spread)
    assert [node for _, _, node in out.admitted[0].groups] == ["n1", "n1"]
    out = decide(usage, [("a", TORCH)], groups=groups, running=running)
    assert [ref for _, ref, _ in out.admitted[0].groups] == ["torch-train", "torch-rollout"]


def test_a_node_group_of_two_nodes_holds_one_job_across_them():
    usage = nodes(("a1", "g", 1, 1), ("a2", "g", 1, 1), ("b1", "h", 1, 1))
    out = decide(usage, [("j", TORCH)])
    assert sorted(node for _, _, node in out.admitted[0].groups) == ["a1", "a2"]


@pytest.mark.parametrize("demand", [0.0, -1.0, 2.0])
def test_the_service_config_refuses_a_demand_outside_the_limit(demand):
    from engine.spec import ServiceConfig

    with pytest.raises(ValueError, match="job_demand must be > 0 and <= group_load_limit"):
        ServiceConfig(job_demand=demand)
