"""Where a new deployment (job, role) becomes resident: a pure function of the WPGs' view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What a role needs its WPG to serve.
ROLE_FUNCTIONS: Mapping[str, frozenset[str]] = {
    "policy": frozenset({"generate", "forward", "forward_backward", "optim_step", "sync_weights"}),
    "reference": frozenset({"forward"}),
}


@dataclass(frozen=True)
class GroupView:
    name: str
    serves: frozenset[str]
    resident: int  # deployments already resident


def place_deployment(groups: Sequence[GroupView], role: str) -> str:
    """The group that serves what ``role`` needs and holds the fewest deployments (ties: name).

    Raises LookupError when no group can serve the role.
    """
    needed = ROLE_FUNCTIONS[role]
    fitting = [g for g in groups if needed <= g.serves]
    if not fitting:
        raise LookupError(f"no worker group serves {sorted(needed)} for role {role!r}")
    return min(fitting, key=lambda g: (g.resident, g.name)).name
