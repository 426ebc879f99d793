"""The per-node StateManager: a Ray actor pinned to its node, serving the node's ``StateStore``.

It is threaded, so transitions run asynchronously and concurrently: a caller gets a Ray future
from ``load`` / ``materialize`` / ``prefetch`` and goes on; a long ``materialize`` does not hold up
another WPG's ``plan_read``. WPG ranks reach it by name (``state_manager()``) and move tensors
through the host tier themselves (``engine.state.rank_client``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.state.fastpath import FAST_METHODS, Server
from engine.state.store import StateStore, default_host_dir

NAME = "state:{node}"


@ray.remote(num_cpus=0, max_concurrency=8)
class StateManager:
    def __init__(self, root: str, host_dir: str, host_budget: int | None = None):
        import os

        self.store = StateStore(Path(root), Path(host_dir), host_budget)
        self._writer = None  # for ``put``: a client of the store in this process
        # one socket per manager process: a restarted manager never answers on its predecessor's
        try:
            self.fast = Server(f"{host_dir}-{os.getpid()}.sock", self, FAST_METHODS)
        except OSError as exc:  # e.g. a path over the 107 bytes a Unix socket may have
            import logging

            logging.getLogger(__name__).warning("StateManager: no node socket (%s); ranks use the actor", exc)
            self.fast = None

    def socket_calls(self) -> int:
        """Calls the node socket has answered."""
        return 0 if self.fast is None else self.fast.served

    def endpoint(self) -> str | None:
        """The path of the socket that serves ``FAST_METHODS`` on this node (None: there is none)."""
        return None if self.fast is None else self.fast.path

    def register_model(self, model, folder):
        return self.store.register_model(model, Path(folder))

    def fork(self, src, dst):
        return self.store.fork(src, dst)

    def has_model(self, model):
        return self.store.has_model(model)

    def keys(self, model):
        return self.store.keys(model)

    def plan_read(self, model, wants):
        return self.store.plan_read(model, wants)

    def done_read(self, token, record=None):
        return self.store.done_read(token, record)

    def reserve(self, model, writes, keeps=(), remove=()):
        return self.store.reserve(model, writes, keeps, remove)

    def commit(self, token, seconds=None):
        return self.store.commit(token, seconds)

    def abort(self, token):
        return self.store.abort(token)

    def put(self, model: str, tensors: dict) -> dict[str, float]:
        """Write ``{(name, shard): tensor}`` into ``model``'s state for a writer on another node (a
        trainer publishing new weights to this node's rollout engine): it cannot map this node's
        host files, so its tensors arrive here over the network and this process copies them in
        (one reservation, committed whole). Returns ``bytes`` and ``seconds``."""
        if self._writer is None:
            from engine.state.rank_client import StateClient

            self._writer = StateClient(self.store, "remote-writer")
        return self._writer.write(model, tensors)

    def load(self, model: str) -> dict[str, Any]:
        """disk -> host for every blob of ``model`` (the first half of a load; a WPG rank does
        host -> device). Returns the model's bytes."""
        token, items, _ = self.store.plan_read(model, list(self.store.keys(model)))
        self.store.done_read(token)
        return {"tensors": len(items), "bytes": sum(meta.nbytes for _, _, pieces in items for _, _, meta, _ in pieces)}

    def prefetch(self, models: list[str]) -> None:
        """Hint that ``models`` run next: keep them in host memory and bring them there now."""
        self.store.hint(models)
        for model in models:
            if self.store.has_model(model):
                self.load(model)

    def materialize(self, model):
        return self.store.materialize(model)

    def drop(self, model):
        return self.store.drop(model)

    def record(self, model, transition, nbytes, seconds):
        return self.store.record(model, transition, nbytes, seconds)

    def set_resident(self, wpg, model, nbytes):
        return self.store.set_resident(wpg, model, nbytes)

    def estimate_load_seconds(self, model, wpg):
        return self.store.estimate_load_seconds(model, wpg)

    def stats(self):
        return self.store.stats()

    def close(self) -> None:
        if self.fast is not None:
            self.fast.close()
        self.store.close()

    def root(self) -> str:
        """Its disk tier's folder."""
        return str(self.store.root)

    def pid(self) -> int:
        import os

        return os.getpid()


def state_root(data_dir: Path, node_id: str) -> Path:
    """A node's disk tier: its own folder, so that on storage the nodes share no manager reads,
    recovers or deletes another's files."""
    return Path(data_dir) / "state" / node_id


def state_manager(data_dir: Path, *, host_budget: int | None = None, node_id: str | None = None):
    """This node's StateManager (``node_id``'s, else the caller's node's), started on first use
    (one per node, found by name), its disk tier in ``state_root``."""
    node_id = node_id or ray.get_runtime_context().get_node_id()
    name = NAME.format(node=node_id[:12])
    try:
        return ray.get_actor(name)
    except ValueError:
        pass
    return StateManager.options(
        name=name, get_if_exists=True, lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(str(state_root(data_dir, node_id)), str(default_host_dir(node_id[:12])), host_budget)


def stop_state_manager() -> None:
    """Stop this node's StateManager, if one runs, and free its shared memory (its disk state
    stays for the next one). Called when the engine shuts down."""
    name = NAME.format(node=ray.get_runtime_context().get_node_id()[:12])
    try:
        manager = ray.get_actor(name)
    except ValueError:
        return
    try:
        ray.get(manager.close.remote(), timeout=30)
    finally:
        ray.kill(manager, no_restart=True)
