"""Where a new deployment (job, role) becomes resident: a pure function of the WPGs' view.

A deployment has a *trainer* side (the weights the optimizer updates, and the passes over them)
and, for a policy, a *rollout* side (the weights ``generate`` samples from, refreshed by
``sync_weights``). Both sides may live in one group (the torch backend serves every function) or in
two: a training WPG (Megatron) and a rollout WPG (vLLM), with ``sync_weights`` moving weights from
the first to the second.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

from engine.api import ROLLOUT_FUNCTIONS, TRAIN_FUNCTIONS

# What each side of a role needs its WPG to serve (the reference has no rollout side).
ROLE_FUNCTIONS: Mapping[str, tuple[frozenset[str], frozenset[str] | None]] = {
    "policy": (TRAIN_FUNCTIONS, ROLLOUT_FUNCTIONS),
    "reference": (frozenset({"forward"}), None),
}


# How a split deployment's ``sync_weights`` runs. "gang": it holds the train WPG and the rollout WPG
# at once, the rollout ranks pulling the trainer's shards. "host": it holds the train WPG only, whose
# ranks write the new weights to the StateManager of the rollout WPG's node; the rollout WPG reloads
# them from there before the deployment's next generate (a swap, which a prefetch hint may overlap),
# and serves other jobs meanwhile.
SYNCS = ("gang", "host")


def check_sync(sync: str) -> str:
    """``sync`` if it names a sync, else ValueError."""
    if sync not in SYNCS:
        raise ValueError(f"sync must be one of {', '.join(SYNCS)}, not {sync!r}")
    return sync


def sync_mode(wanted: str, *, trainer_swaps: bool, rollout_swaps: bool, rollout_kind: str,
              nodes: Sequence[Collection[Hashable]]) -> str:
    """The sync a split deployment gets: ``wanted`` ("host" or "gang"), or "gang" where a host-tier
    sync cannot run: both groups must keep state in a StateManager (they swap), the rollout side
    must be vLLM engines (they reload from there), and each rollout group must lie on one node, whose
    StateManager the trainer writes to (``nodes``: the nodes of each rollout group's ranks, by name
    or by index)."""
    check_sync(wanted)
    possible = (trainer_swaps and rollout_swaps and rollout_kind == "vllm" and bool(nodes)
                and all(len(set(group)) == 1 for group in nodes))
    return "host" if wanted == "host" and possible else "gang"


@dataclass(frozen=True)
class GroupView:
    name: str
    serves: frozenset[str]
    resident: int  # deployments already resident
    kind: str = ""  # backend kind (torch, megatron, vllm)


@dataclass(frozen=True)
class Placement:
    trainer: str
    rollout: str | None = None  # None: the role never generates

    def group_for(self, fn: str) -> str:
        if fn in ROLLOUT_FUNCTIONS:
            if self.rollout is None:
                raise ValueError(f"{fn!r} needs a rollout side, and this deployment has none")
            return self.rollout
        return self.trainer

    @property
    def split(self) -> bool:
        return self.rollout is not None and self.rollout != self.trainer


def _pick(groups: Sequence[GroupView], needed: frozenset[str], other: frozenset[str], kind: str | None,
          what: str, role: str) -> GroupView:
    """The group serving ``needed`` (of ``kind`` if given): specialised groups (serving none of
    ``other``) first, then fewest resident deployments, then name."""
    fitting = [g for g in groups if needed <= g.serves and (kind is None or g.kind == kind)]
    if not fitting:
        of_kind = f" of kind {kind!r}" if kind else ""
        raise LookupError(f"no worker group{of_kind} serves {sorted(needed)} for the {what} of role {role!r}")
    return min(fitting, key=lambda g: (bool(g.serves & other), g.resident, g.name))


def place_deployment(
    groups: Sequence[GroupView], role: str, *, trainer_kind: str | None = None, rollout_kind: str | None = None,
) -> Placement:
    """Place a deployment of ``role``. Raises LookupError when no group can serve a side.

    A group built for one side (a Megatron trainer, a vLLM engine) wins over a group that serves
    everything; the rollout shares the trainer's group only when no rollout group fits.
    """
    train_needs, rollout_needs = ROLE_FUNCTIONS[role]
    trainer = _pick(groups, train_needs, ROLLOUT_FUNCTIONS, trainer_kind, "trainer", role)
    if rollout_needs is None:
        return Placement(trainer.name)
    dedicated = [g for g in groups if g.name != trainer.name and not g.serves & TRAIN_FUNCTIONS]
    colocated = rollout_needs <= trainer.serves and (rollout_kind is None or trainer.kind == rollout_kind)
    if colocated and not [g for g in dedicated if rollout_kind is None or g.kind == rollout_kind]:
        return Placement(trainer.name, trainer.name)
    rollout = _pick(groups, rollout_needs, TRAIN_FUNCTIONS, rollout_kind, "rollout", role)
    return Placement(trainer.name, rollout.name)


def assign_wpgs(rollout_loads: Sequence[float], train_loads: Sequence[float], replicas: int, rollout_demand: float,
                train_demand: float, *, limit: float = 1.0) -> tuple[tuple[int, ...], int] | None:
    """Which of a pool's shared WPGs a new job's calls go to: ``replicas`` distinct rollout WPGs and
    one train WPG, the least loaded ones (load: fraction of a WPG's time the jobs on it declared;
    ties to the lower index). None when the job does not fit: a WPG would exceed ``limit``, or the
    pool has fewer rollout WPGs than the job has replicas."""
    if replicas > len(rollout_loads) or not train_loads:
        return None
    rollout = sorted(range(len(rollout_loads)), key=lambda i: (rollout_loads[i], i))[:replicas]
    train = min(range(len(train_loads)), key=lambda i: (train_loads[i], i))
    if any(rollout_loads[i] + rollout_demand > limit + 1e-12 for i in rollout):
        return None
    if train_loads[train] + train_demand > limit + 1e-12:
        return None
    return tuple(sorted(rollout)), train
