"""Worker process groups on Ray: ``WorkerRank`` actors and the ``WorkerGroup`` handle over them.

A WPG is created once by the engine runtime and outlives jobs; the router sends it requests.

Where a WPG runs: its ranks are packed on one node by a Ray placement group (``STRICT_PACK``, one
bundle of device slots per rank), on the node the caller names (``node``: a Ray node id; the
bundles select it by Ray's ``ray.io/node-id`` label) or, without one, where Ray finds room. A group
whose bundles cannot be reserved in ``place_timeout_s`` is not started (``PlacementError``) and
holds nothing. Ranks of a multi-rank group meet (torch.distributed rendezvous) at a port free on
their node's address, so a group never depends on another node. Shutting a group down kills its
ranks and removes its placement group, which frees its slots.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from engine.api import OptimizerConfig, Request
from engine.errors import EngineFault, UnknownKey, fault_reason
from engine.workers import faults
from engine.workers.backend import Backend, BackendKind

NOOP = "noop"  # a call that does nothing in the rank: probes the call path (liveness, overhead)
CREATE = "create"  # makes a deployment resident from a model folder (payload: model_dir, trainable, optimizer)
# A ``sync_weights`` whose payload has this key (the rollout group's name) runs on the trainer group
# alone: it publishes the weights to the StateManager of the rollout group's node, and the rollout
# group reloads them from there before its next generate of the deployment (a host-tier sync; see
# the router).
PUBLISH_TO = "publish_to"
PUBLISH_NODE = "publish_node"  # the node of that group, whose StateManager gets the weights
# Calls whose payload and result are large (batches, completions): they travel through the object
# store by reference, so the scheduler between caller and rank never copies them.
BULKY = frozenset({"generate", "forward", "forward_backward"})
DEVICE_RESOURCE = "device"  # per-node custom resource: one slot per accelerator (or CPU slot)


NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
PLACE_TIMEOUT_S = 60.0


def publishes_to(request: Request) -> str | None:
    """The rollout group a host-tier ``sync_weights`` request publishes for, else None."""
    if request.fn != "sync_weights" or not isinstance(request.payload, dict):
        return None
    return request.payload.get(PUBLISH_TO)


class PlacementError(RuntimeError):
    """A worker group's ranks could not be reserved on one node (none had the slots free)."""


@ray.remote(num_cpus=0)
def _rendezvous() -> str:
    """Run in a group's first bundle: an address its ranks can meet at, on their node."""
    host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def _reserve(name: str, world_size: int, slots: dict[str, float], node: str | None, timeout_s: float) -> Any:
    """A placement group of one bundle per rank, packed on one node (``node`` if given)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    selector = [{NODE_LABEL: node}] * world_size if node else None
    pg = placement_group([dict(slots)] * world_size, strategy="STRICT_PACK", name=f"wpg:{name}",
                         bundle_label_selector=selector)
    if not pg.wait(timeout_s):
        remove_placement_group(pg)
        where = f"node {node}" if node else "any one node"
        raise PlacementError(f"worker group {name}: {world_size} rank(s) of {slots} could not be reserved on "
                             f"{where} within {timeout_s:g} s")
    return pg


@dataclass(frozen=True)
class Swapping:
    """How a WPG holds several jobs' states: at most ``max_resident`` deployments on its devices at
    once (the least recently used is swapped out through the node's StateManager to make room);
    ``host_budget``: bytes of the StateManager's host tier if this WPG starts it; ``write_behind``:
    the outgoing job's state is written while the incoming job already runs (its device memory is
    freed when the write is done, so for that long both states are on the device)."""

    max_resident: int
    host_budget: int | None = None
    write_behind: bool = True  # swap the outgoing job out in the background (False: before the switch)


@ray.remote(num_cpus=0, concurrency_groups={"hints": 1})
class WorkerRank:
    """One rank of a WPG. Executes calls one at a time, in submission order (Ray actor order).

    With ``swapping``, a call for a deployment that is not resident first swaps it in (and the
    least recently used one out, when the WPG is full); every rank of a group sees the same calls
    in the same order, so all make the same swaps."""

    def __init__(
        self, kind: str, rank: int, world_size: int, threads: int, data_dir: str, dist_url: str | None = None,
        wpg: str = "", swapping: Swapping | None = None,
    ):
        import torch  # a rank's, never its handle's: a job's driver holds handles without torch

        # Pinned so results do not depend on where (or beside what) the actor runs.
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.rank = rank
        self.wpg, self.data_dir = wpg, data_dir
        # dist_url only where there is one, so single-rank backends need not know the argument
        extra = {} if dist_url is None else {"dist_url": dist_url}
        self.backend = backend_class(kind)(rank=rank, world_size=world_size, data_dir=Path(data_dir), **extra)
        self.backend.warm()  # part of the group's start-up, not of its first job's create
        self.swapping = swapping
        self.lru: collections.OrderedDict[tuple, None] = collections.OrderedDict()
        self.swaps = {"in": 0, "out": 0, "in_bytes": 0, "out_bytes": 0, "in_seconds": 0.0, "out_seconds": 0.0,
                      "in_prefetched": 0}
        self._setup_s = 0.0  # switch seconds of the call being run
        if swapping is not None:
            from engine.state.manager import state_manager
            from engine.state.rank_client import StateClient

            def connect():
                return state_manager(Path(data_dir), host_budget=swapping.host_budget)

            self.backend.state_client = StateClient(connect, f"{wpg}:{rank}")  # accounting per rank
            self.backend.state_client.connect()  # part of the start-up, as the backend's warm-up

    def create(self, deployment, model_dir: str, trainable: bool, optimizer: OptimizerConfig | None = None,
               side: str = ""):
        deployment = tuple(deployment)
        self._make_room(deployment)
        extra = {"side": side} if side else {}  # backends that are one side only keep their default
        info = self.backend.create(deployment, Path(model_dir), trainable=trainable, optimizer=optimizer, **extra)
        self.lru[deployment] = None
        return info

    def drop(self, deployment) -> None:
        self.lru.pop(tuple(deployment), None)
        self.backend.drop(tuple(deployment))

    def deployments(self) -> list[tuple[str, str]]:
        """Every deployment this rank holds, on its device or swapped out."""
        return [tuple(d) for d in self.lru]

    def drop_job(self, job: str) -> int:
        """Release every deployment of ``job`` here (its driver is being replaced); returns how many."""
        mine = [d for d in self.lru if d[0] == job]
        for deployment in mine:
            self.drop(deployment)
        return len(mine)

    def run(self, request: Request) -> tuple[Any, dict[str, float]]:
        """Execute a call the scheduler dispatched; returns its result and its timing: ``setup_s``
        (switching the deployment's state in) and ``exec_s`` (the rest), queue wait excluded.
        A bulky call's result comes back as ``[ObjectRef]`` (see ``BULKY``)."""
        faults.check(self.data_dir, "rank", job=request.job, fn=request.fn, wpg=self.wpg, rank=self.rank)
        started = time.perf_counter()
        self._setup_s = 0.0
        create = request.fn == CREATE
        try:
            result = self.create(request.deployment, **request.payload) if create else self.execute(request)
        except UnknownKey as exc:  # this rank swapped the state out; only a dead StateManager loses it
            raise EngineFault(f"the state of {'/'.join(request.deployment)} was lost with the StateManager "
                              f"({fault_reason(exc)})") from None
        total = time.perf_counter() - started
        if request.fn in BULKY and self.rank == 0:
            result = [ray.put(result)]  # nested, so it stays a reference on its way to the caller
        return result, {"setup_s": self._setup_s, "exec_s": max(0.0, total - self._setup_s)}

    def execute(self, request: Request) -> Any:
        if request.fn == NOOP:
            return None
        if publishes_to(request) is not None:
            deployment = tuple(request.deployment)
            if self.swapping is not None:
                self.switch(deployment)
            return self.backend.publish_weights(deployment, node=request.payload.get(PUBLISH_NODE))
        if self.swapping is None:
            return self.backend.execute(request.deployment, request.fn, request.payload)
        deployment = tuple(request.deployment)
        if request.fn not in self.backend.loads_state:
            self.switch(deployment)
            return self.backend.execute(deployment, request.fn, request.payload)
        self._make_room(deployment)  # the call itself loads the deployment
        result = self.backend.execute(deployment, request.fn, request.payload)
        self.lru[deployment] = None
        self.lru.move_to_end(deployment)
        return result

    # -- job state on and off the devices ------------------------------------------------------
    def _count(self, direction: str, result: dict[str, Any]) -> None:
        self.swaps[direction] += 1
        self.swaps[f"{direction}_bytes"] += result["bytes"]
        self.swaps[f"{direction}_seconds"] += result["seconds"]
        if result.get("prefetched"):
            self.swaps["in_prefetched"] += 1

    def _make_room(self, keep) -> None:
        if self.swapping is None:
            return
        resident = [d for d in self.lru if d != keep and self.backend.is_resident(d)]
        while len(resident) >= self.swapping.max_resident:
            # written behind: the incoming job's call runs while the outgoing state is copied out
            self.offload(resident.pop(0), background=self.swapping.write_behind)

    def switch(self, deployment) -> dict[str, Any]:
        """Make ``deployment`` resident (swapping the least recently used one out if full)."""
        deployment = tuple(deployment)
        result = {"bytes": 0, "seconds": 0.0}
        if not self.backend.is_resident(deployment):
            self._make_room(deployment)
            result = self.backend.swap_in(deployment)
            self._count("in", result)
            self._setup_s += result["seconds"]
        self.lru[deployment] = None
        self.lru.move_to_end(deployment)
        return result

    def offload(self, deployment, background: bool = False) -> dict[str, Any]:
        """Swap ``deployment`` out to the StateManager's host tier, freeing its device memory
        (``background``: the write finishes while the rank goes on)."""
        result = self.backend.swap_out(tuple(deployment), background=background)
        if result["seconds"]:
            self._count("out", result)
        return result

    @ray.method(concurrency_group="hints")
    def weights_changed(self, deployment, complete: bool = True) -> None:
        """The deployment's rollout weights in the StateManager were replaced by a host-tier sync
        (``complete``: every tensor; else the sync failed half-way). The engine no longer holds
        them: its next generate of the deployment reloads them (or refuses torn ones). Served in
        its own thread, so the scheduler need not wait for this group's current call."""
        self.backend.weights_changed(tuple(deployment), complete)

    @ray.method(concurrency_group="hints")
    def prefetch(self, deployment) -> None:
        """Hint: ``deployment`` runs next here; start reading its state in the background. Served
        in its own thread, so it starts while the current call runs (the calls keep their order)."""
        self.backend.prefetch(tuple(deployment))

    def materialize(self, deployment) -> list[dict[str, Any]]:
        """Make the deployment's state durable: its current state to the host tier (if it
        changed), then host -> disk. Returns the StateManager's report per model id (rank 0)."""
        deployment = tuple(deployment)
        self.backend.swap_out(deployment, release=False)
        if self.rank:
            return []
        client = self.backend.state_client
        return [client.call("materialize", model) for model in self.backend.state_models(deployment)]

    def swap_stats(self) -> dict[str, Any]:
        out = {**self.swaps, "resident": [list(d) for d in self.lru if self.backend.is_resident(d)]}
        out["out_bytes"] += self.backend.written_behind  # written behind, once each write is done
        return out

    def export_weights(self, deployment, names: list[str] | None = None):
        if self.swapping is not None:  # a swapped-out deployment has no weights here until swapped in
            self.switch(deployment)
        return self.backend.export_weights(tuple(deployment), names)

    def weight_names(self, deployment) -> list[str]:
        return self.backend.weight_names(tuple(deployment))

    def stats(self) -> dict[str, Any]:
        return self.backend.stats()

    def info(self) -> dict[str, Any]:
        import torch

        return {"pid": os.getpid(), "threads": torch.get_num_threads(), "rank": self.rank,
                "node": ray.get_runtime_context().get_node_id()}

    def ping(self) -> None:
        return None


@dataclass
class WorkerGroup:
    """Handle over a WPG's ranks; picklable, so it can be handed to a job's driver actor."""

    name: str
    kind: BackendKind
    ranks: list[Any]  # WorkerRank actor handles
    serves: frozenset[str]
    devices: float = 1.0  # device slots the group holds (ranks x devices per rank)
    max_resident: int = 0  # deployments it holds on its devices at once (0: all, no swapping)
    nodes: tuple[str, ...] = ()  # Ray node id of each rank
    placement: Any = None  # its Ray placement group (removed at shutdown)
    rendezvous: str | None = None  # where its ranks met (multi-rank groups)

    @classmethod
    def start(
        cls, name: str, kind: BackendKind | str = BackendKind.TORCH, *, world_size: int = 1,
        threads: int = 2, data_dir: Path, devices_per_rank: float = 1.0, swapping: Swapping | None = None,
        serves: frozenset[str] | None = None, node: str | None = None, place_timeout_s: float = PLACE_TIMEOUT_S,
    ) -> WorkerGroup:
        """``serves``: the functions this group is for, a subset of its backend's (e.g. a torch group
        that only rolls out, beside a torch group that only trains); default all of them. ``node``:
        the Ray node id its ranks go on (see the module's placement)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        kind = BackendKind(kind)
        offered = backend_class(kind).serves
        if serves is not None and not frozenset(serves) <= offered:
            raise ValueError(f"a {kind.value} group cannot serve {sorted(frozenset(serves) - offered)}")
        # On a GPU node a device slot is a GPU: Ray hands each rank its share (CUDA_VISIBLE_DEVICES).
        gpus = devices_per_rank if ray.cluster_resources().get("GPU", 0) > 0 else 0
        slots = {DEVICE_RESOURCE: devices_per_rank, **({"GPU": gpus} if gpus else {})}
        pg = _reserve(name, world_size, slots, node, place_timeout_s)
        try:
            def bundle(rank: int) -> PlacementGroupSchedulingStrategy:
                return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)

            dist_url = ray.get(_rendezvous.options(scheduling_strategy=bundle(0)).remote()) if world_size > 1 else None
            ranks = [
                WorkerRank.options(
                    name=f"wpg:{name}:{rank}", resources={DEVICE_RESOURCE: devices_per_rank}, num_gpus=gpus,
                    scheduling_strategy=bundle(rank),
                ).remote(kind.value, rank, world_size, threads, str(data_dir), dist_url, name, swapping)
                for rank in range(world_size)
            ]
            infos = ray.get([r.info.remote() for r in ranks])
        except BaseException:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)  # its ranks die with it
            raise
        return cls(name=name, kind=kind, ranks=ranks, serves=frozenset(serves) if serves is not None else offered,
                   devices=world_size * devices_per_rank, max_resident=swapping.max_resident if swapping else 0,
                   nodes=tuple(info["node"] for info in infos), placement=pg, rendezvous=dist_url)

    def create(self, deployment, model_dir: Path, *, trainable: bool, optimizer: OptimizerConfig | None):
        refs = [r.create.remote(deployment, str(model_dir), trainable, optimizer) for r in self.ranks]
        return ray.get(refs)[0]

    def _all(self, method: str, *args) -> list[Any]:
        return ray.get([getattr(r, method).remote(*args) for r in self.ranks])

    def switch(self, deployment) -> dict[str, Any]:
        return self._all("switch", deployment)[0]

    def offload(self, deployment) -> dict[str, Any]:
        return self._all("offload", deployment)[0]

    def prefetch(self, deployment) -> None:
        """Asynchronous on purpose: each rank starts its background read when it gets here."""
        for r in self.ranks:
            r.prefetch.remote(deployment)

    def materialize(self, deployment) -> list[dict[str, Any]]:
        return self._all("materialize", deployment)[0]

    def drop_job(self, job: str) -> None:
        self._all("drop_job", job)

    def submit(self, request: Request) -> ray.ObjectRef:
        """Every rank executes the call (SPMD); rank 0's result is the call's result."""
        refs = [r.execute.remote(request) for r in self.ranks]
        return refs[0]

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)
        if self.placement is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # removed already, or its node is gone with it
                remove_placement_group(self.placement)


# The registry lives with its only caller: the backends import backend.py, never the other way round.
def backend_class(kind: BackendKind | str) -> type[Backend]:
    kind = BackendKind(kind)
    if kind is BackendKind.TORCH:
        from engine.workers.torch_backend import TorchBackend

        return TorchBackend
    if kind is BackendKind.VLLM:
        from engine.workers.vllm_backend import VllmBackend

        return VllmBackend
    if kind is BackendKind.MEGATRON:
        from engine.workers.megatron_backend import MegatronBackend

        return MegatronBackend
    raise ValueError(f"no backend {kind!r}")  # pragma: no cover - the enum exhausts the cases
