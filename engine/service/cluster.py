"""The cluster as the scheduler sees it, read live from Ray: its nodes, their device slots and node
groups, and where the worker groups run.

A node's *device slots* are its GPUs, or, on a CPU node, its ``device`` resource (the slots the
worker-group ranks ask for). Its *node group* (the unit placement fills: a job's groups go on one)
is, first found: the node label ``plexrl.node_group`` (``ray start --labels``), a resource named
``node_group:<name>`` (``ray start --resources``), else the node alone (its id). Nodes without
device slots (a head node that only runs the controller) are not listed: nothing is placed there.

``nodes_from_ray``, ``node_usage``, ``domains`` (the node groups as the placer's domains) and
``choose_nodes`` (where new worker groups go) are pure (tested on tables); ``read_nodes`` reads Ray
now, so a node that joined or left is seen at the next read.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.scheduler.admission import Domain

GROUP_LABEL = "plexrl.node_group"
GROUP_RESOURCE = "node_group:"


@dataclass(frozen=True)
class Node:
    id: str  # Ray's node id (every node of a one-machine test cluster has the same address)
    node_group: str
    devices: int  # device slots
    address: str = ""


def nodes_from_ray(raw: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Alive nodes with device slots, from ``ray.nodes()`` entries, by node group then id. A node
    that names two node groups is an error (ValueError): placement could not tell where it is."""
    out = []
    for entry in raw:
        if not entry.get("Alive"):
            continue
        resources = entry.get("Resources") or {}
        devices = int(_slots(resources))
        if devices <= 0:
            continue
        node_id = entry["NodeID"]
        label = (entry.get("Labels") or {}).get(GROUP_LABEL)
        named = sorted(k[len(GROUP_RESOURCE):] for k in resources if k.startswith(GROUP_RESOURCE))
        if len(named) > 1 or (label and named and named != [label]):
            both = sorted({*named, *([label] if label else [])})
            raise ValueError(f"node {node_id} is in more than one node group: {both}")
        group = label or (named[0] if named else node_id)
        out.append(Node(node_id, group, devices, entry.get("NodeManagerAddress", "")))
    return sorted(out, key=lambda n: (n.node_group, n.id))


def domains(nodes: Iterable[Node]) -> list[Domain]:
    """The placer's domains: one per node group, its nodes in id order. The placer packs a worker
    group onto whole nodes of one size, so a node group's nodes must have the same device slots
    (ValueError naming the group otherwise)."""
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(node.node_group, []).append(node)
    out = []
    for name in sorted(groups):
        sizes = sorted({n.devices for n in groups[name]})
        if len(sizes) > 1:
            raise ValueError(f"node group {name!r} mixes nodes of {sizes} device slots; give each size a group")
        out.append(Domain(name, len(groups[name]), sizes[0]))
    return out


#: Device slots in the placer's whole devices: worker groups may hold fractions of a slot.
SLOT_UNITS = 100


def choose_nodes(usage: Sequence[Mapping[str, Any]], sizes: Sequence[float],
                 prefer: Iterable[str] = ()) -> list[str] | None:
    """Nodes for new worker groups of ``sizes`` device slots (a group's ranks share one node), as
    the placer lays WPGs on a domain (``Domain.plan``: the largest first, each on the fullest node
    that holds it), all in one node group: one of ``prefer`` (node groups the job's other groups
    are on) first, else the one they leave with the fewest free slots (best fit), then by name.
    ``usage``: ``node_usage`` rows. None when no node group holds them all now."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in usage:
        groups.setdefault(row["node_group"], []).append(row)
    units = [round(size * SLOT_UNITS) for size in sizes]
    preferred = set(prefer)
    best, best_key = None, None
    for name, rows in sorted(groups.items()):
        # a smaller node of a mixed group: its slots, never more
        domain = slot_domain(name, rows, lambda row: min(row["free_devices"], row["devices"]))
        per_node = domain.node_devices
        if any(u > per_node for u in units):
            continue  # a group never spans nodes
        plan = domain.plan(units)
        if plan is None:
            continue
        key = (name not in preferred, domain.free_devices() - sum(units), name)
        if best_key is None or key < best_key:
            best, best_key = [rows[devices[0][0]]["id"] for devices in plan], key
    return best


def slot_domain(name: str, rows: Sequence[Mapping[str, Any]], room: Callable[[Mapping[str, Any]], float]) -> Domain:
    """Node group ``name``'s nodes (``node_usage`` rows, in this order) as a placer's domain in
    1/``SLOT_UNITS`` slot units: nodes of the largest node's size, ``room(row)`` slots free on each."""
    per_node = round(max(r["devices"] for r in rows) * SLOT_UNITS)
    domain = Domain(name, len(rows), per_node)
    for i, row in enumerate(rows):
        domain.free[i] = list(range(min(per_node, max(0, math.floor(room(row) * SLOT_UNITS + 1e-6)))))
    return domain


def read_nodes() -> list[Node]:
    """The cluster's nodes now (Ray must be initialised)."""
    import ray

    return nodes_from_ray(ray.nodes())


def ray_free_devices() -> dict[str, float]:
    """Device slots Ray has free on each node now (taken by anything: the engine's groups, other
    actors on the cluster); empty if this Ray cannot tell (its per-node view is not public API)."""
    try:
        from ray._private.state import available_resources_per_node

        per_node = available_resources_per_node()
    except (ImportError, AttributeError):
        return {}
    return {node: float(_slots(r)) for node, r in per_node.items()}


def _slots(resources: Mapping[str, float]) -> float:
    """A node's device slots in a Ray resource map: its GPUs, else its ``device`` resource."""
    from engine.workers.group import DEVICE_RESOURCE  # torch: not for every importer of the controller

    return resources.get("GPU", 0) or resources.get(DEVICE_RESOURCE, 0)


def held_slots(groups: Iterable[Any]) -> list[tuple[str, float]]:
    """(node id, device slots) for each rank of these worker groups, for ``node_usage``."""
    return [(node, g.devices / len(g.ranks)) for g in groups for node in g.nodes]


def node_usage(nodes: Iterable[Node], held: Iterable[tuple[str, float]],
               ray_free: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Each node with the device slots the engine's worker groups hold there (``held``: (node id,
    devices) pairs, one per rank; slots held on a node that left are not counted anywhere) and
    its free slots: the rest, or fewer where Ray counts fewer free (``ray_free``: other actors
    may hold slots)."""
    taken: dict[str, float] = {}
    for node_id, devices in held:
        taken[node_id] = taken.get(node_id, 0.0) + devices
    out = []
    for n in nodes:
        free = n.devices - taken.get(n.id, 0.0)
        if ray_free and n.id in ray_free:
            free = min(free, ray_free[n.id])
        out.append({"id": n.id, "node_group": n.node_group, "address": n.address, "devices": n.devices,
                    "held_devices": taken.get(n.id, 0.0), "free_devices": free})
    return out


def architecture(model: str) -> str | None:
    """The architecture a model's config names (``architectures[0]``, else its ``model_type``);
    None for a model not built or not found here."""
    from engine.errors import ModelNotFound
    from engine.models import resolve_model

    try:
        config = json.loads((resolve_model(model, build_missing=False) / "config.json").read_text())
    except (ModelNotFound, OSError, ValueError):
        return None
    names = config.get("architectures") or [config.get("model_type")]
    return names[0] if names and names[0] else None


def rollout_affinity(model: str) -> str:
    """Which vLLM rollout group may host jobs of ``model`` (a vLLM engine is built for one model
    configuration): a preset by its name (its configuration is fixed by it; nothing is built
    here, the job's driver builds it), a model folder by a short hash of its configuration as the
    engine checks it (``vllm_backend.model_signature``), so folders of one configuration share a
    group and others get their own. ModelNotFound for a folder that is not a model."""
    from engine.models import PRESETS, resolve_model
    from engine.workers.vllm_backend import model_signature

    if model in PRESETS:
        return model
    signature = json.dumps(model_signature(resolve_model(model)), sort_keys=True)
    return hashlib.sha256(signature.encode()).hexdigest()[:10]
