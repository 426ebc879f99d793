"""Placement of a new deployment: a pure function of the worker groups' view."""

import pytest

from engine.api import FUNCTIONS
from engine.scheduler.placement import (
    ROLE_FUNCTIONS,
    ROLLOUT_FUNCTIONS,
    TRAIN_FUNCTIONS,
    GroupView,
    Placement,
    place_deployment,
    sync_mode,
)

ALL = frozenset(FUNCTIONS)
FORWARD_ONLY = frozenset({"forward"})


def torch_group(name, resident=0):
    return GroupView(name, ALL, resident, "torch")


def megatron(name, resident=0):
    return GroupView(name, TRAIN_FUNCTIONS, resident, "megatron")


def vllm(name, resident=0):
    return GroupView(name, ROLLOUT_FUNCTIONS, resident, "vllm")


def test_fewest_resident_group_wins():
    groups = [torch_group("a", 3), torch_group("b", 1), torch_group("c", 2)]
    assert place_deployment(groups, "policy") == Placement("b", "b")
    assert place_deployment(groups, "reference") == Placement("b")


def test_ties_go_to_the_first_name():
    groups = [torch_group("wpg-2", 1), torch_group("wpg-1", 1), torch_group("wpg-3", 0)]
    assert place_deployment(groups, "policy").trainer == "wpg-3"
    tied = [torch_group("wpg-2", 1), torch_group("wpg-1", 1)]
    assert place_deployment(tied, "policy").trainer == "wpg-1"
    assert place_deployment(list(reversed(tied)), "policy").trainer == "wpg-1"  # view order is irrelevant


def test_only_groups_that_serve_the_role_count():
    groups = [GroupView("ref-only", FORWARD_ONLY, 0), torch_group("full", 5)]
    assert place_deployment(groups, "policy") == Placement("full", "full")  # a forward-only group cannot train
    assert place_deployment(groups, "reference") == Placement("ref-only")


def test_no_fitting_group_raises_lookup_error():
    with pytest.raises(LookupError, match="role 'policy'"):
        place_deployment([GroupView("ref-only", FORWARD_ONLY, 0)], "policy")
    with pytest.raises(LookupError):
        place_deployment([], "reference")
    with pytest.raises(LookupError, match="rollout"):  # a trainer alone cannot sample
        place_deployment([megatron("m")], "policy")


def test_a_policy_splits_over_dedicated_trainer_and_rollout_groups():
    groups = [vllm("v"), megatron("m"), torch_group("t")]
    assert place_deployment(groups, "policy") == Placement("m", "v")
    assert place_deployment(groups, "policy").split
    # the reference only needs forward; a dedicated trainer group takes it too
    assert place_deployment(groups, "reference") == Placement("m")


def test_a_torch_trainer_pairs_with_a_dedicated_rollout_group():
    assert place_deployment([torch_group("t"), vllm("v")], "policy") == Placement("t", "v")
    assert place_deployment([megatron("m"), torch_group("t")], "policy") == Placement("m", "t")
    assert not place_deployment([torch_group("t")], "policy").split


def test_kinds_constrain_both_sides():
    groups = [torch_group("t"), megatron("m"), vllm("v")]
    assert place_deployment(groups, "policy", trainer_kind="torch", rollout_kind="torch") == Placement("t", "t")
    assert place_deployment(groups, "policy", trainer_kind="torch", rollout_kind="vllm") == Placement("t", "v")
    assert place_deployment(groups, "policy", rollout_kind="torch") == Placement("m", "t")
    with pytest.raises(LookupError, match="kind 'megatron'"):
        place_deployment([torch_group("t"), vllm("v")], "policy", trainer_kind="megatron")


def test_routing_by_function():
    split = Placement("m", "v")
    assert {split.group_for(fn) for fn in TRAIN_FUNCTIONS} == {"m"}
    assert {split.group_for(fn) for fn in ROLLOUT_FUNCTIONS} == {"v"}
    with pytest.raises(ValueError, match="needs a rollout side"):
        Placement("m").group_for("generate")


def test_roles_need_what_the_api_offers():
    assert set(ROLE_FUNCTIONS) == {"policy", "reference"}
    assert TRAIN_FUNCTIONS | ROLLOUT_FUNCTIONS == ALL
    for train, rollout in ROLE_FUNCTIONS.values():
        assert train <= ALL
        assert rollout is None or rollout <= ALL


@pytest.mark.parametrize(("trainer_swaps", "rollout_swaps", "kind", "nodes", "want"), [
    (True, True, "vllm", [("n1",)], "host"),
    (True, True, "vllm", [("n1", "n1"), ("n2",)], "host"),  # each rollout group on one node: its StateManager
    (False, True, "vllm", [("n1",)], "gang"),  # the trainer has no StateManager client to write with
    (True, False, "vllm", [("n1",)], "gang"),  # the engine keeps its own copy
    (True, True, "torch", [("n1",)], "gang"),  # only a vLLM engine reloads published weights
    (True, True, "vllm", [("n1", "n2")], "gang"),  # a rollout group over two nodes: two StateManagers
    (True, True, "vllm", [("n1",), ()], "gang"),  # a group's nodes unknown
    (True, True, "vllm", [], "gang"),  # no rollout group
])
def test_a_host_tier_sync_only_where_each_rollout_group_has_one_statemanager(trainer_swaps, rollout_swaps, kind,
                                                                             nodes, want):
    assert sync_mode("host", trainer_swaps=trainer_swaps, rollout_swaps=rollout_swaps, rollout_kind=kind,
                     nodes=nodes) == want
    assert sync_mode("gang", trainer_swaps=trainer_swaps, rollout_swaps=rollout_swaps, rollout_kind=kind,
                     nodes=nodes) == "gang"


def test_an_unknown_sync_is_refused():
    with pytest.raises(ValueError, match="sync must be one of gang, host, not 'fast'"):
        sync_mode("fast", trainer_swaps=True, rollout_swaps=True, rollout_kind="vllm", nodes=[("n1",)])
