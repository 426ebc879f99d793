"""A WPG rank's side of the StateManager: it maps the host tier's files itself, so state moves
between its device and the node's shared memory without passing through the manager process.

``StateClient`` talks to a ``StateManager`` actor (or, in-process, a ``StateStore``): ``write``
offloads tensors (device -> host), ``read`` loads them (host -> device; the manager first brings
missing blobs from disk), ``prefetch`` starts a ``read`` in a background thread so that it overlaps
the call running now, and ``take`` collects it.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from engine.state.fastpath import FAST_METHODS, Closed, Connections
from engine.state.layout import WHOLE, ShardSpec
from engine.state.store import Mismatch, ReadItem, StateStore, TensorMeta

Key = tuple[str, ShardSpec]  # (canonical tensor name, shard) within one model


def map_host(path: str | None, meta: TensorMeta, *, write: bool = False) -> torch.Tensor:
    """A tensor over a host-tier file (no copy; it keeps the mapping alive). Readers map it
    read-only, so a stray write cannot reach the shared bytes."""
    if path is None or meta.nbytes == 0:
        return torch.empty(meta.shape, dtype=meta.torch_dtype)
    with open(path, "r+b" if write else "rb") as f:
        return _as_tensor(_mmap(f.fileno(), meta.nbytes, write), meta)


def _mmap(fd: int, nbytes: int, write: bool) -> mmap.mmap:
    # MAP_POPULATE: the page tables are filled in one call instead of one fault per page
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, nbytes, flags=flags, prot=mmap.PROT_READ | (mmap.PROT_WRITE if write else 0))


# Readers map host files read-only on purpose; torch warns about every such buffer. Matched on its
# message, so no other warning is hidden (a catch_warnings per tensor would cost more than a copy).
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def _as_tensor(mm: mmap.mmap, meta: TensorMeta) -> torch.Tensor:
    return torch.frombuffer(mm, dtype=torch.uint8).view(meta.torch_dtype).reshape(meta.shape)


class HostMaps:
    """A rank's mappings of host-tier files, kept between swaps.

    Mapping a file and filling its page tables costs about as much as copying it, and a swap maps
    a file per tensor, so a rank keeps its mappings and the typed tensors over them, found by the
    file's name: the StateManager never renames a host file nor gives a name to another file, and
    hands a freed blob's file (same name) to the next blob of that size, so a job swapped out and
    in again reuses mappings whose pages are already in place. A mapping whose file was deleted
    would keep its memory alive: ``sweep`` drops those when the store's epoch says files were
    deleted. At most ``limit`` bytes and ``entries`` files (each holds a descriptor) stay mapped.

    A kept mapping of a live file costs page tables, not memory (the pages are the host tier's),
    so ``limit`` is large: a rank that swaps two jobs' training states (weights, gradients, two
    moments each, mapped once to write and once to read) must keep them all, or it maps a file
    per tensor again at every swap. The descriptors are bounded by the process's limit.
    """

    def __init__(self, limit: int = 64 << 30, entries: int | None = None):
        if entries is None:
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            entries = max(256, min(8192, soft // 4))  # leave most descriptors to the process
        self.limit, self.entries = limit, entries
        # (path, write) -> (map, its bytes, typed views of it by meta); least recently used first
        self._maps: OrderedDict[tuple[str, bool], tuple[mmap.mmap, int, dict[TensorMeta, torch.Tensor]]] = OrderedDict()
        self._bytes = 0
        self._epoch: Any = None  # the store's epoch at the last sweep
        self._lock = threading.Lock()

    def tensor(self, path: str | None, meta: TensorMeta, *, write: bool = False) -> torch.Tensor:
        if path is None or meta.nbytes == 0:
            return torch.empty(meta.shape, dtype=meta.torch_dtype)
        n = meta.nbytes
        if n > self.limit:
            return map_host(path, meta, write=write)
        key = (path, write)
        with self._lock:
            found = self._maps.get(key)
            if found is not None and found[1] == n:
                self._maps.move_to_end(key)  # most recently used last
                views = found[2]
                t = views.get(meta)
                if t is None:
                    t = views[meta] = _as_tensor(found[0], meta)
                return t
            if found is not None:  # cannot happen with pooled files (same size); be safe
                self._drop(key)
        with open(path, "r+b" if write else "rb") as f:
            mm = _mmap(f.fileno(), n, write)  # it holds its own descriptor
        t = _as_tensor(mm, meta)
        with self._lock:
            if key in self._maps:  # mapped meanwhile by another thread: keep one
                self._drop(key)
            self._maps[key] = (mm, n, {meta: t})
            self._bytes += n
            while self._bytes > self.limit or len(self._maps) > self.entries:
                self._drop(next(iter(self._maps)))
        return t

    def _drop(self, key) -> None:
        _, n, _ = self._maps.pop(key)
        self._bytes -= n
        # tensors still using the map keep it alive; it is unmapped when the last one goes

    def sweep(self, epoch: Any = None) -> None:
        """Forget mappings of files that were deleted (their memory goes once no tensor uses it).
        ``epoch``: the store's (``StateStore.epoch``); nothing to look at if it has not changed."""
        with self._lock:
            if epoch is not None and epoch == self._epoch:
                return
            self._epoch = epoch
            for key in [k for k in self._maps if not os.path.exists(k[0])]:
                self._drop(key)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._maps):
                self._drop(key)


def _narrow(t: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    if spec == WHOLE:
        return t
    size, rest = divmod(t.shape[spec.dim], spec.count)
    if rest:
        raise Mismatch(f"dimension {spec.dim} of size {t.shape[spec.dim]} does not split into {spec.count}")
    return t.narrow(spec.dim, spec.index * size, size)


def assemble(item: ReadItem, maps: HostMaps | None = None) -> torch.Tensor:
    """The asked-for slice over the host files: a view when one stored piece covers it, else the
    stored shards joined once (and sliced, when the reader's layout differs)."""
    mapped = map_host if maps is None else maps.tensor
    _, want, pieces = item
    if len(pieces) == 1:
        _, path, meta, stored = pieces[0]
        t = mapped(path, meta)
        return t if stored is want or stored == want else _narrow(t, want)
    pieces = sorted(pieces, key=lambda p: p[3].index)
    first = pieces[0][3]
    t = torch.cat([mapped(path, meta) for _, path, meta, _ in pieces], dim=first.dim)
    if len(pieces) < first.count:  # the stored shards that make up exactly the wanted one
        return t
    return _narrow(t, want)


_RECONNECT_TRIES = 100  # 0.1 s apart

# Calls that may simply be repeated against a restarted StateManager (it recovers what was
# materialized; ``done_read`` of a plan the dead one made unpins nothing, its pins died with it);
# any other call that meets a dead manager fails, and its caller starts over.
_RETRY_AFTER_RESTART = frozenset({"endpoint", "plan_read", "done_read", "keys", "has_model", "stats", "record",
                                  "set_resident", "register_model", "estimate_load_seconds"})


class StateClient:
    """``manager``: a ``StateStore`` (in-process), or a function returning this node's StateManager
    actor (called again, to reach a restarted manager, when the one it had died)."""

    def __init__(self, manager: Any, wpg: str):
        self._connect = manager if callable(manager) and not isinstance(manager, StateStore) else None
        self.manager = manager if self._connect is None else self._connect()
        self.local = isinstance(self.manager, StateStore)
        # the node-local socket for the calls on a swap's path (the actor is the fallback)
        self._fast = Connections(lambda: self._ray_call("endpoint"))
        self.wpg = wpg
        self._pool: ThreadPoolExecutor | None = None
        self._staged: dict[str, tuple[int, Future]] = {}
        self._lock = threading.Lock()
        self.maps = HostMaps()

    def connect(self) -> None:
        """Reach the manager now and learn its socket: the node's manager starts on its first use
        (about a second), which a group's start-up then pays instead of its first job's ``create``."""
        if not self.local:
            self._fast.locate()

    @property
    def reached(self) -> bool:
        """Whether the manager has answered this client (in-process: always)."""
        return self.local or self._fast.known

    def call(self, method: str, *args) -> Any:
        if self.local:
            return getattr(self.manager, method)(*args)
        if method in FAST_METHODS and self._fast.available:
            try:
                return self._fast.call(method, args)
            except Closed:
                # the socket failed: the actor says whether the manager died (and reconnects);
                # a manager without a socket is not asked again
                if self._fast.available:
                    self._fast.reset()
        return self._ray_call(method, *args)

    def _ray_call(self, method: str, *args) -> Any:
        import ray
        from ray.exceptions import RayActorError

        # A dead manager's name stays registered for a moment after its process is gone (its
        # socket tells first): the lookup may hand back the dead one until Ray has noticed.
        for attempt in range(_RECONNECT_TRIES):
            try:
                return ray.get(getattr(self.manager, method).remote(*args))
            except RayActorError:
                if self._connect is None:
                    raise
                self._fast.reset()  # the new manager has a socket of its own
                self.manager = self._connect()
                if method not in _RETRY_AFTER_RESTART or attempt == _RECONNECT_TRIES - 1:
                    raise
                if attempt:
                    time.sleep(0.1)
        raise AssertionError("unreachable")  # pragma: no cover

    def plan(self, model: str, wants: Sequence[Key]) -> tuple[str, list[ReadItem]]:
        """The manager's ``plan_read``; this rank's kept mappings of deleted files are dropped on the
        way. ``release(token)`` must follow."""
        token, items, epoch = self.call("plan_read", model, list(wants))
        self.maps.sweep(epoch)
        return token, items

    def _reserve(self, model, writes, kept, remove) -> tuple[str, list[str | None]]:
        token, paths, epoch = self.call("reserve", model, writes, kept, list(remove))
        self.maps.sweep(epoch)
        return token, paths

    # -- device -> host --------------------------------------------------------------------------
    def write(
        self, model: str, tensors: Mapping[Key, torch.Tensor], *, keeps: Mapping[Key, str] | None = None,
        remove: Sequence[Key] = (),
    ) -> dict[str, float]:
        """Offload ``tensors`` as ``model``'s state under their keys; ``keeps``: keys whose tensor is
        unchanged since it was read from that blob (nothing is copied); ``remove``: keys to delete."""
        started = time.perf_counter()
        items = list(tensors.items())
        writes = [(name, shard, TensorMeta.of(t)) for (name, shard), t in items]
        kept = [(name, shard, blob) for (name, shard), blob in (keeps or {}).items()]
        token, paths = self._reserve(model, writes, kept, remove)
        nbytes = 0
        try:
            for path, (_, t), (_, _, meta) in zip(paths, items, writes, strict=True):
                if path is not None:
                    self.maps.tensor(path, meta, write=True).copy_(t)
                    nbytes += meta.nbytes
        except BaseException:
            self.call("abort", token)
            raise
        self.call("commit", token, time.perf_counter() - started)
        return {"bytes": nbytes, "seconds": time.perf_counter() - started}

    # -- host -> device --------------------------------------------------------------------------
    def read(
        self, model: str, wants: Sequence[Key], *, into: Mapping[Key, torch.Tensor] | None = None,
        device: torch.device | str = "cpu",
    ) -> tuple[dict[Key, torch.Tensor], dict[Key, str]]:
        """Load ``wants`` of ``model``: copied into the tensors of ``into`` where given (shape and
        dtype must match), else into new tensors on ``device``. Returns the tensors and, for keys
        read from exactly their own blob, that blob (a later ``write`` may keep it if unchanged)."""
        started = time.perf_counter()
        token, items = self.plan(model, wants)
        out: dict[Key, torch.Tensor] = {}
        clean: dict[Key, str] = {}
        into = into or {}
        nbytes = 0
        record = None
        try:
            for item in items:  # per tensor: as little Python as a plain copy loop
                name, shard, pieces = item
                key = (name, shard)
                src = assemble(item, self.maps)
                dst = into.get(key)
                if dst is None:
                    dst = src.to(device, copy=True)
                elif dst.shape != src.shape or dst.dtype != src.dtype:
                    raise Mismatch(f"{model}: {name} {shard} is stored as "
                                   f"{TensorMeta.of(src).describe()}, the reader holds "
                                   f"{TensorMeta.of(dst).describe()}")
                else:
                    dst.copy_(src)
                out[key] = dst
                nbytes += src.nbytes
                if len(pieces) == 1 and pieces[0][3] == shard:
                    clean[key] = pieces[0][0]
            record = (model, nbytes, time.perf_counter() - started)
        finally:
            self.release(token, record)
        return out, clean

    def release(self, token: str, record: tuple[str, int, float] | None = None) -> None:
        """The manager's ``done_read`` (unpin a plan's blobs; ``record`` the copy), not waited for
        on the socket: it has nothing to answer, and this thread's next call is served after it."""
        if not self.local and self._fast.available:
            try:
                return self._fast.send("done_read", (token, record))
            except Closed:
                if self._fast.available:
                    self._fast.reset()
        self.call("done_read", token, record)

    def submit(self, fn, *args) -> Future:
        """Run ``fn(*args)`` on this client's background thread (the one prefetches use, in order)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-background")
            return self._pool.submit(fn, *args)

    def prefetch(
        self, model: str, wants: Sequence[Key], *, device: torch.device | str = "cpu", version: int = 0,
    ) -> None:
        """Start reading ``model``'s ``wants`` into new device tensors in the background.
        ``version``: which state of the model this is; ``take`` returns it only for that version."""
        with self._lock:
            if model in self._staged:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-background")
            self._staged[model] = (version, self._pool.submit(self.read, model, list(wants), device=device))

    def take(self, model: str, version: int = 0) -> tuple[dict[Key, torch.Tensor], dict[Key, str]] | None:
        """The prefetched tensors of ``model`` (waiting for them) if a prefetch of this ``version``
        was started and succeeded, else None (a read of an older version is dropped)."""
        with self._lock:
            staged = self._staged.pop(model, None)
        if staged is None:
            return None
        tag, future = staged
        if tag != version:
            future.cancel()
            return None
        try:
            return future.result()
        except Exception:  # a hint that failed (its manager died, say): the caller reads again
            return None

    def discard(self, model: str) -> None:
        with self._lock:
            staged = self._staged.pop(model, None)
        if staged is not None:
            staged[1].cancel()
