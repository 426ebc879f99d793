"""Placement of a new deployment: a pure function of the worker groups' view."""

import pytest

from engine.api import FUNCTIONS
from engine.scheduler.placement import ROLE_FUNCTIONS, GroupView, place_deployment

ALL = frozenset(FUNCTIONS)
FORWARD_ONLY = frozenset({"forward"})


def test_fewest_resident_group_wins():
    groups = [GroupView("a", ALL, 3), GroupView("b", ALL, 1), GroupView("c", ALL, 2)]
    assert place_deployment(groups, "policy") == "b"
    assert place_deployment(groups, "reference") == "b"


def test_ties_go_to_the_first_name():
    groups = [GroupView("wpg-2", ALL, 1), GroupView("wpg-1", ALL, 1), GroupView("wpg-3", ALL, 0)]
    assert place_deployment(groups, "policy") == "wpg-3"
    tied = [GroupView("wpg-2", ALL, 1), GroupView("wpg-1", ALL, 1)]
    assert place_deployment(tied, "policy") == "wpg-1"
    assert place_deployment(list(reversed(tied)), "policy") == "wpg-1"  # order of the view is irrelevant


def test_only_groups_that_serve_the_role_count():
    groups = [GroupView("ref-only", FORWARD_ONLY, 0), GroupView("full", ALL, 5)]
    assert place_deployment(groups, "policy") == "full"  # a forward-only group cannot train
    assert place_deployment(groups, "reference") == "ref-only"


def test_no_fitting_group_raises_lookup_error():
    with pytest.raises(LookupError, match="role 'policy'"):
        place_deployment([GroupView("ref-only", FORWARD_ONLY, 0)], "policy")
    with pytest.raises(LookupError):
        place_deployment([], "reference")


def test_roles_need_what_the_api_offers():
    assert set(ROLE_FUNCTIONS) == {"policy", "reference"}
    assert all(needed <= ALL for needed in ROLE_FUNCTIONS.values())
