"""Where the live engine's jobs run, and when they start: the placer's admission
(``engine.scheduler.admission.Placer``, the code the simulator runs) on the cluster as Ray reports
it now.

Each admission round rebuilds the placer's view from what runs: one domain per node group, its
nodes' device slots in 1/``SLOT_UNITS`` units (a worker group may hold a fraction of a slot); the
worker groups that running jobs use (``Placer.restore``) and those jobs at their demand
(``Placer.seat``). Groups no running job uses are not recorded: their slots count free, and where
the placer forms a group on their node the engine reuses one of the same key there, or releases
them first. The waiting jobs then arrive in submission order and the placer admits what fits,
first come first served (``backfill`` off: the first job that does not fit holds the later ones,
so none waits forever; the view is rebuilt each round, so no reservation could outlive it). A job
no node group could ever hold does not hold the queue: it waits with that reason, in case a node
joins.

A job's shape: one rollout WPG and one train WPG of the service's group size. A rollout WPG's
affinity is its group key (backend, ranks, model configuration: a vLLM engine is built for one);
a train WPG's is its own key, so jobs of two model configurations may share a trainer. A WPG takes
jobs while their demands sum to at most the policy's ``limit``.

Pure: tested on tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.scheduler.admission import AdmissionPolicy, Demand, Domain, JobShape, Placer
from engine.service.cluster import SLOT_UNITS, rollout_affinity, slot_domain

if TYPE_CHECKING:
    from engine.spec import JobSpec, ServiceConfig

GroupKey = tuple[str, str, int, str]  # (side, backend, ranks, affinity)


@dataclass(frozen=True)
class LiveGroup:
    """A running worker group: its name, key, the node its ranks are on, the device slots it holds."""

    name: str
    key: GroupKey
    node: str
    devices: float


@dataclass(frozen=True)
class Admitted:
    """A job the round starts: for each of its keys (train first), ``(key, ref, node)``: with a
    ``node``, a new group of that key goes there, ``ref`` naming it within the round; without, it
    joins the running group ``ref`` names (or the one formed for ``ref`` earlier in the round)."""

    job: str
    groups: tuple[tuple[GroupKey, str, str], ...]


@dataclass(frozen=True)
class Round:
    admitted: tuple[Admitted, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)  # waiting job -> why it still waits


def group_keys(job_id: str, spec: JobSpec, *, dedicated: bool = False) -> list[GroupKey]:
    """The kinds of group a job runs on, train first: one per side, by backend, ranks and affinity
    (a vLLM engine is built for one model configuration: jobs of another get a group of their own;
    ``rollout_affinity`` may read a model folder); with ``dedicated``, groups of its own (the
    job's id in their affinity)."""
    def own(aff: str) -> str:
        if not dedicated:
            return aff
        return f"{aff}@{job_id}" if aff else job_id

    rollout = rollout_affinity(spec.model) if spec.rollout == "vllm" else ""
    return [("train", spec.trainer, spec.tp, own("")), ("rollout", spec.rollout, 1, own(rollout))]


def live_policy(config: ServiceConfig) -> AdmissionPolicy:
    """The placer's policy as the live engine runs it: first come first served, each job at its
    declared demand on the WPGs it was admitted to until it ends (not ``adaptive``: no profile,
    no move yet); with ``config.spread``, a job alone in the queue spreads."""
    limit = config.group_load_limit
    return AdmissionPolicy(limit=limit, slowdown_bound=max(1.5, limit), backfill=False,
                           spread_alone=config.spread, adaptive=False)


def declared(config: ServiceConfig) -> Demand:
    """A job's demand until measured: ``config.job_demand`` of a group's time on each side."""
    return Demand(config.job_demand, config.job_demand)


def affinity(key: GroupKey) -> str:
    """The placer's affinity of a group key (its side is the placer's WPG kind)."""
    _, backend, ranks, aff = key
    return f"{backend}/tp{ranks}/{aff}"


def shape(keys: Sequence[GroupKey], units: int, capacity: int = 1) -> JobShape:
    """A job's shape: one rollout and one train WPG of ``units``, each holding ``capacity`` states."""
    train = next(k for k in keys if k[0] == "train")
    rollout = next(k for k in keys if k[0] == "rollout")
    return JobShape(affinity(rollout), 1, units, units, capacity, capacity, train_affinity=affinity(train))


def admission_round(usage: Sequence[Mapping[str, Any]], groups: Sequence[LiveGroup],
                    running: Mapping[str, Sequence[str]], waiting: Sequence[tuple[str, Sequence[GroupKey]]], *,
                    group_devices: float, demand: Demand, policy: AdmissionPolicy,
                    demands: Mapping[str, Demand] | None = None) -> Round:
    """One admission round. ``usage``: ``cluster.node_usage`` rows (``held_devices``: the engine's
    groups, idle ones included); ``groups``: the engine's groups; ``running``: each running job's
    group names; ``waiting``: (job, its group keys) in submission order; ``demand``: a job's
    until ``demands`` has one measured for it."""
    units = round(group_devices * SLOT_UNITS)
    placer, where = view(usage, policy)
    demands = demands or {}
    busy = {name for names in running.values() for name in names}
    live = {g.name: g for g in groups}
    for g in sorted(groups, key=lambda g: g.name):
        if g.name in busy and g.node in where:
            domain, index = where[g.node]
            free = len(placer.domains[domain].free[index])
            placer.restore(g.name, domain, g.key[0], affinity(g.key), index, min(free, round(g.devices * SLOT_UNITS)))
    for job, names in sorted(running.items()):
        if names and all(n in placer.slots for n in names):
            keys = [live[n].key for n in names]
            sides = dict(zip((k[0] for k in keys), names, strict=True))
            placer.seat(job, shape(keys, units), demands.get(job, demand), [sides["rollout"]], sides["train"], 0.0)
    reasons: dict[str, str] = {}
    keys_of = dict(waiting)
    for job, keys in waiting:
        try:
            placer.arrive(job, shape(keys, units), demands.get(job, demand), 0.0)
        except ValueError:
            reasons[job] = (f"no node group can hold its worker groups ({group_devices:g} device slots each, on "
                            f"one node): it waits for a larger node to join")
    node_at = {at: node for node, at in where.items()}
    admitted = []
    for p in placer.admit(0.0):
        formed = {s.name: s for s in p.formed}
        chosen = []
        for name in (p.train, *p.rollout):
            key = next(k for k in keys_of[p.job] if k[0] == ("train" if name == p.train else "rollout"))
            slot = formed.get(name)
            chosen.append((key, name, node_at[(slot.domain, slot.devices[0][0])] if slot else ""))
        admitted.append(Admitted(p.job, tuple(chosen)))
    left = placer.queue()  # in the order admission tried them
    if left:
        first = left[0]
        reasons[first] = _why(placer, first, keys_of[first], group_devices)
        reasons.update(dict.fromkeys(left[1:], f"behind {first} in the queue"))
    return Round(tuple(admitted), reasons)


def view(usage: Sequence[Mapping[str, Any]], policy: AdmissionPolicy) -> tuple[Placer, dict[str, tuple[str, int]]]:
    """An empty placer over the node groups, each node's slots free as far as the engine's groups
    (all of them) or nothing else holds them; and node id -> (domain, node index)."""
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for row in usage:
        by_group.setdefault(row["node_group"], []).append(row)
    domains, where = [], {}
    for name, rows in sorted(by_group.items()):
        rows = sorted(rows, key=lambda r: r["id"])
        domains.append(slot_domain(name, rows, lambda r: r.get("held_devices", 0.0) + max(0.0, r["free_devices"])))
        where.update({row["id"]: (name, i) for i, row in enumerate(rows)})
    if not domains:
        domains = [Domain("(no nodes)", 0, 1)]
    return Placer(domains, policy), where


def _why(placer: Placer, job: str, keys: Sequence[GroupKey], group_devices: float) -> str:
    """Why the first waiting job does not start: the groups it would need formed, and the room."""
    demand = placer.demand(job)
    limit = placer.policy.limit
    missing = [k for k in keys if not any(
        s.kind == k[0] and s.affinity == affinity(k) and s.load + demand.of(k[0]) <= limit + 1e-9
        for s in placer.slots.values())]
    free = sum(d.free_devices() for d in placer.domains.values()) / SLOT_UNITS
    total = sum(d.devices for d in placer.domains.values()) / SLOT_UNITS
    if not missing:
        return (f"waiting for one node group to hold both its worker groups: {free:g} of {total:g} device "
                f"slots free")
    names = ", ".join(f"{k[1]} {k[0]}" for k in missing)
    full = [k for k in missing if any(s.kind == k[0] and s.affinity == affinity(k) for s in placer.slots.values())]
    busy = (f"; its {', '.join(f'{k[1]} {k[0]}' for k in full)} group(s) are full (jobs' demands sum to the "
            f"limit {limit:g})") if full else ""
    return (f"waiting for {len(missing) * group_devices:g} device slots for its {names} worker group(s), "
            f"{group_devices:g} on one node each: {free:g} of {total:g} free{busy}")
