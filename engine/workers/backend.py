"""The backend interface a worker group rank implements, and the registry that picks one by name.

Called by ``WorkerRank.execute`` (engine/workers/group.py), one call at a time per rank, in the
order the router submitted them.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from engine.api import OptimizerConfig

if TYPE_CHECKING:  # torch: for backends, not for the group handles a job's driver holds
    from engine.state.layout import WeightShard

Deployment = tuple[str, str]  # (job, role)

#: The decoder architectures (``config.json``'s ``architectures[0]``) every backend runs; which
#: model folders are accepted is decided above (``engine.models.check``) from this list.
DECODERS = frozenset({"Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"})

#: A host-tier weight sync writes about this many bytes per StateManager reservation (a round trip
#: each), so it neither asks once per tensor nor holds a second copy of the whole model.
PUBLISH_BATCH_BYTES = 64 << 20

#: Calls that change no state of the deployment: after only these, its state in the StateManager
#: is still current, so swapping it out moves no bytes.
READ_ONLY = frozenset({"forward", "generate", "save_checkpoint"})


def _logical(keys: dict[tuple[str, Any], Any], model: str) -> dict[str, Any]:
    """``{name: TensorMeta of the whole tensor}`` from a stored model's keys (whole tensors, or the
    shards of one layout)."""
    from engine.state.store import TensorMeta

    if not keys:
        raise KeyError(f"the StateManager has no model {model!r} (the rollout side was never created)")
    out: dict[str, Any] = {}
    for (name, spec), meta in keys.items():
        shape = list(meta.shape)
        if spec.dim is not None:
            shape[spec.dim] *= spec.count
        out[name] = TensorMeta(meta.dtype, tuple(shape))
    return out


def _store_on(client: Any, node: str | None, model: str) -> tuple[dict, Any]:
    """``model``'s stored keys in ``node``'s StateManager, and a function that writes
    ``{(name, shard): tensor}`` there: through this rank's ``client`` on its own node, else through
    that node's manager actor."""
    import ray

    if node is None or node == ray.get_runtime_context().get_node_id():
        return client.call("keys", model), lambda tensors: client.write(model, tensors)
    from engine.state.manager import NAME

    try:
        manager = ray.get_actor(NAME.format(node=node[:12]))
    except ValueError:
        raise RuntimeError(f"node {node[:12]} has no StateManager to publish {model} to") from None
    return ray.get(manager.keys.remote(model)), lambda tensors: ray.get(manager.put.remote(model, tensors))


def state_id(deployment: Deployment, side: str = "") -> str:
    """The StateManager model id of a deployment's state: the trainer's weights and optimizer
    state (``job/role``), a rollout engine's weights (``job/role@rollout``), or the torch
    backend's own sampling copy beside its trainer (``job/role@sampler``)."""
    job, role = deployment
    return f"{job}/{role}" + (f"@{side}" if side else "")


@dataclass
class Residency:
    """Where a deployment's state is: on this rank's device (``resident``) and/or in the
    StateManager under ``keys`` (``{model id: [(name, shard)]}``, this rank's part); ``dirty``: the
    device copy changed since it was last written to or read from the StateManager."""

    resident: bool = True
    dirty: bool = True
    keys: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    version: int = 0  # bumped whenever the stored state changes (a prefetch of an older one is void)
    pending: Any = None  # (future, tensors) of a background swap-out still being written


class BackendKind(enum.StrEnum):
    TORCH = "torch"
    VLLM = "vllm"
    MEGATRON = "megatron"


class Backend(ABC):
    #: API functions this backend can execute (the router only sends these).
    serves: ClassVar[frozenset[str]]

    def __init__(self, *, rank: int, world_size: int, data_dir: Path, dist_url: str | None = None):
        self.rank, self.world_size, self.data_dir = rank, world_size, Path(data_dir)
        self.dist_url = dist_url  # rendezvous of the group's ranks (``tcp://host:port``); None: one rank

    def warm(self) -> None:
        """Load what every ``create`` needs (libraries a rank imports on first use), while its group
        starts: the start-up then holds the cost once, and no job's first call holds a shared group
        for it (a job's ``create`` takes as long on a new group as on one that served others).
        Nothing to load by default."""
        return None

    @abstractmethod
    def create(
        self,
        deployment: Deployment,
        model_dir: Path,
        *,
        trainable: bool,
        optimizer: OptimizerConfig | None,
        side: str = "",
    ) -> dict[str, Any]:
        """Make a deployment's state resident from its base model; returns facts (params, bytes).
        ``side``: "rollout" when this is the sampling side of a deployment whose trainer is on
        another group (its state then has a model id of its own, ``state_id(deployment, side)``)."""

    @abstractmethod
    def execute(self, deployment: Deployment, fn: str, payload: dict[str, Any]) -> Any:
        """Run one API function for one deployment whose state is resident here."""

    @abstractmethod
    def drop(self, deployment: Deployment) -> None:
        """Release a deployment's state."""

    def export_weights(self, deployment: Deployment, names: list[str] | None = None) -> list[WeightShard]:
        """This rank's trainer weights as ``(canonical name, tensor, ShardSpec)``, for the named
        logical tensors (all when ``names`` is None, in a fixed order). Used by ``sync_weights``
        across worker groups: the receiving backend gathers one logical tensor at a time."""
        raise NotImplementedError(f"{type(self).__name__} does not export weights")

    def weight_names(self, deployment: Deployment) -> list[str]:
        """The canonical names ``export_weights`` yields, in its order (a receiver asks once, then
        pulls one logical tensor at a time). Backends that can list names cheaply override this."""
        return [name for name, _, _ in self.export_weights(deployment, None)]

    def publish_weights(self, deployment: Deployment, *, node: str | None = None,
                        batch_bytes: int = PUBLISH_BATCH_BYTES) -> dict[str, Any]:
        """``sync_weights`` through the host tier: write this rank's part of the deployment's trainer
        weights into the StateManager of the rollout group's ``node`` (None: this rank's) as its
        rollout state (``state_id(deployment, "rollout")``), in the dtype stored there, a batch of
        logical tensors at a time. Each rank writes its own shards; a whole tensor (the same on
        every rank) is written by rank 0 only. On this node the rank copies into the host files
        itself; another node's manager receives the tensors over the network and copies them in.
        The rollout group is not held meanwhile: its engine reloads the weights from its node's
        StateManager before the deployment's next ``generate`` there.

        Returns ``bytes`` (the logical weights published, as a rollout-side sync counts them),
        ``written`` (this rank's bytes) and ``seconds``."""
        client = self.state_client
        if client is None:
            raise RuntimeError("a host-tier weight sync needs a trainer group that swaps state (a StateManager)")
        started = time.perf_counter()
        model = state_id(deployment, "rollout")
        keys, write = _store_on(client, node, model)
        stored = _logical(keys, model)
        names = self.weight_names(deployment)
        unknown = [n for n in names if n not in stored]
        if unknown:
            raise ValueError(f"trainer weights {unknown[:5]} are not in {deployment}'s rollout model")
        logical = written = batched = 0
        batch: list[str] = []
        for i, name in enumerate(names):
            batch.append(name)
            batched += stored[name].nbytes
            if batched < batch_bytes and i + 1 < len(names):
                continue
            tensors = dict(self._shards_to_publish(deployment, batch, stored))
            if tensors:
                write(tensors)
            written += sum(t.numel() * t.element_size() for t in tensors.values())
            logical, batched, batch = logical + batched, 0, []
        return {"bytes": logical, "written": written, "seconds": time.perf_counter() - started}

    def _shards_to_publish(self, deployment: Deployment, names: list[str], stored: dict[str, Any]):
        """``((name, spec), tensor)`` this rank writes for ``names``, checked against the rollout
        model's logical shapes and converted to its dtypes."""
        from engine.state.layout import WHOLE
        from engine.state.store import shard_shape

        for name, tensor, spec in self.export_weights(deployment, names):
            if spec == WHOLE and self.rank:
                continue  # rank 0 writes the tensors every rank holds whole
            meta = stored[name]
            want = shard_shape(meta.shape, spec)
            if tuple(tensor.shape) != want:
                raise ValueError(f"{name}{'' if spec == WHOLE else f' shard {spec.index} of {spec.count}'}: "
                                 f"trainer shape {tuple(tensor.shape)}, rollout {want}")
            yield (name, spec), tensor.to(meta.torch_dtype)

    def stats(self) -> dict[str, Any]:
        """Backend counters for tests and benchmarks (e.g. weight swaps: bytes and seconds)."""
        return {}

    # -- swapping job state through the node's StateManager ------------------------------------
    #: this rank's ``engine.state.rank_client.StateClient``; set by the rank when its WPG swaps states
    state_client: Any = None
    #: functions that make the deployment resident themselves (e.g. a rollout engine's
    #: ``sync_weights`` loads the new weights whole): no swap-in before them
    loads_state: ClassVar[frozenset[str]] = frozenset()
    #: bytes that background swap-outs have finished writing (counted when each is done)
    written_behind: int = 0

    def is_resident(self, deployment: Deployment) -> bool:
        return True

    def state_models(self, deployment: Deployment) -> list[str]:
        """The StateManager model ids this rank keeps the deployment's state under."""
        return []

    def swap_out(self, deployment: Deployment, *, release: bool = True, background: bool = False) -> dict[str, Any]:
        """Write the deployment's state to the StateManager's host tier (only if it changed since
        it was last there) and, with ``release``, free this rank's copy; with ``background``, the
        write happens while the rank goes on (the device copy is freed when it is done)."""
        raise NotImplementedError(f"{type(self).__name__} cannot swap job state")

    def swap_in(self, deployment: Deployment) -> dict[str, Any]:
        """Make a swapped-out deployment resident again from the StateManager (using what a
        ``prefetch`` already read, if it did)."""
        raise NotImplementedError(f"{type(self).__name__} cannot swap job state")

    def weights_changed(self, deployment: Deployment, complete: bool = True) -> None:
        """A host-tier sync replaced the deployment's rollout weights in the StateManager
        (``publish_weights`` on its trainer group); only a rollout backend that loads them from
        there takes part."""
        raise NotImplementedError(f"{type(self).__name__} does not load published weights")

    def prefetch(self, deployment: Deployment) -> None:  # noqa: B027 - a hint: ignoring it is correct
        """Start reading a swapped-out deployment's state in the background (a hint)."""
